package testenv

import (
	"bytes"
	"sync"
)

// LogBuffer is a log destination (an slog handler's writer) that tests
// may read while it is written.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String is what was written so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
