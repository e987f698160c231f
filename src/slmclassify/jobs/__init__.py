"""The commands' work, as functions a program can call: each reads its input, runs the library,
writes its output and returns its figures as a summary (data); the CLI (`cli/`) parses options and
prints the summaries. `classify` streams a table into an output (resumable), `verify` checks probes
against the per-item path, `evaluate` scores against gold labels, `fit` trains a learned head,
`ray_classify` runs classify on Ray actors."""
