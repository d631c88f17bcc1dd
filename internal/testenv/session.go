package testenv

import (
	"fmt"
	"log/slog"
	"sync"
)

// Session is a T for programs that are not tests, such as the demo: it
// logs through slog, runs cleanups in reverse order on Close, and turns
// Fatalf into a panic that Run recovers after cleaning up.
type Session struct {
	Log *slog.Logger

	mu       sync.Mutex
	cleanups []func()
}

var _ T = (*Session)(nil)

// fatal is what Fatalf panics with; Run recognises it.
type fatal struct{ msg string }

func (s *Session) Helper() {}

func (s *Session) Cleanup(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cleanups = append(s.cleanups, f)
}

func (s *Session) Logf(format string, args ...any) {
	s.Log.Info(fmt.Sprintf(format, args...))
}

func (s *Session) Fatalf(format string, args ...any) {
	panic(fatal{fmt.Sprintf(format, args...)})
}

// Close runs the registered cleanups, last first.
func (s *Session) Close() {
	s.mu.Lock()
	fs := s.cleanups
	s.cleanups = nil
	s.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}

// Run calls f and then Close; a Fatalf inside f becomes the returned error.
func (s *Session) Run(f func() error) (err error) {
	defer s.Close()
	defer func() {
		if r := recover(); r != nil {
			fe, ok := r.(fatal)
			if !ok {
				panic(r)
			}
			err = fmt.Errorf("%s", fe.msg)
		}
	}()
	return f()
}
