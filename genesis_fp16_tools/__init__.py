"""Tools built on genesis-fp16 that its core never imports: the benchmark (`genesis_fp16_tools.bench`, the
`genesis-fp16 bench` command) and the RLHF precision forensics (`genesis_fp16_tools.forensics`, `genesis-fp16
forensics`). They are installed with the package and reached through the command entry points only."""
