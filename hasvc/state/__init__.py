"""Pure replication decisions: no trio, no sockets, no clock reads, no store I/O (time and randomness are arguments)."""
