"""Link emulation and path probing: the test bench around the transport, never used by it.

`traces` models link rates over time and `linkspec` parses link specs; `bottleneck` is the
sans-I/O core of one emulated direction and `emulator` its asyncio UDP relay; `netns` shapes a
kernel path with network namespaces and `tbf`; `probe` measures what the network signal sees of
a path (`netsense probe`). See docs/EMULATOR.md.
"""
