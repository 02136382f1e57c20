"""`python -m launch --supervise RUN_DIR`: the detached supervisor of `lab up --detach`."""

from launch.cli import up

if __name__ == "__main__":
    up(prog_name="lab up")
