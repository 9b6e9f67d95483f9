"""Link emulation and path probing: the test bench around the transport, never used by it.

`linkspec` parses link specs and rate traces, `emulator` is the userspace UDP bottleneck,
`netns` shapes a kernel path with network namespaces and `tbf`, and `probe` measures what the
network signal sees of a path (`netsense probe`). See docs/EMULATOR.md.
"""
