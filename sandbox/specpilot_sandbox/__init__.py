"""specpilot's test doubles and its demo, a distribution of their own (sandbox/pyproject.toml) that the operator
image does not install: the sandbox Kubernetes API (`apiserver`, kmock's emulator), a kubelet that runs what the
operator creates as local processes (`kubelet`), the simulated vLLM engine (`engine`, `engine_core`, `clock`),
vLLM-named metrics from a driven state (`exporter`), the profiles' check against the twin (`fidelity`) and
`specpilot demo` (`demo`)."""
