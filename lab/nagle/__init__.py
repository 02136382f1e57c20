"""`lab nagle`, the idle-connection Nagle / delayed-ACK probe (docs/nagle.md): the command, its
settings and arms, running them, the statistics, the verdict and its words, the kernel's timer
facts, the report and the plots."""
