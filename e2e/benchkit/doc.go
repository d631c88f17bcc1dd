// Package benchkit holds the helpers the bench commands of e2e
// (scalebench, tunnelbench, poolbench, kubeletbench, soak) share, each once:
//
//   - process sampling (proc.go): CPU, the CPU time a process has used
//     (/proc/<pid>/stat); ReadMem, its resident memory now and at its peak
//     (/proc/<pid>/status); Written, the bytes it wrote to storage
//     (/proc/<pid>/io); RealPID, the process that runs a binary started
//     through `ip netns exec`;
//   - HTTP timing (http.go): NewConnClient, a client that makes a new TCP
//     connection and TLS handshake per request; Get, a GET that must
//     answer 200 with a body; SaveURL, a GET written to a file (profiles);
//     GetJSON, a GET decoded from JSON (admin /status);
//     Pct, the nearest-rank percentile of sorted latencies;
//   - running a bench (run.go): Note, a progress line (each bench wraps
//     it in its own note, so go vet checks the formats); Sleep, a sleep
//     that ends with its context; Parallel, a bounded pool of workers;
//     Progress, a callback every interval; Tail, the end of a long log
//     for an error message.
//
// What builds and runs the world (world.RunBench, world.BenchBinaries,
// world.LoadAvg, world.Get, world.Metric) stays in package world, which
// the e2e tests share too; the world's own log is testenv.Session.Logf,
// which RunBench's logger shows only when verbose. benchkit holds no measurement of its own: each
// bench's figures, tables and last machine-readable line are its own.
package benchkit
