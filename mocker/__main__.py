"""`python -m mocker` = the `mocker` command."""

from mocker.cli import main

main()
