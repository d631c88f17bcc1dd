package acmestore

import (
	"context"
	"errors"
	"io/fs"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/tether-edge/tether/internal/testenv"
)

func TestEscapeKey(t *testing.T) {
	for key, want := range map[string]string{
		"certificates/acme-v02.api.letsencrypt.org-directory/gw.example.com/gw.example.com.crt": "certificates_2Facme-v02.api.letsencrypt.org-directory_2Fgw.example.com_2Fgw.example.com.crt",
		"acme/ca/users/ops@example.com/ops.key":                                                 "acme_2Fca_2Fusers_2Fops_40example.com_2Fops.key",
		"a_b":                                                                                   "a_5Fb",
		"a_2Fb":                                                                                 "a_5F2Fb",
		"..x/.y":                                                                                "_2E.x_2F.y",
		"wildcard_.example.com":                                                                 "wildcard_5F.example.com",
	} {
		got, err := EscapeKey(key)
		if err != nil || got != want {
			t.Errorf("EscapeKey(%q) = %q, %v; want %q", key, got, err, want)
		}
		back, ok := UnescapeKey(got)
		if !ok || back != key {
			t.Errorf("UnescapeKey(%q) = %q, %v; want %q", got, back, ok, key)
		}
	}
	for _, bad := range []string{"", strings.Repeat("a/", 100)} {
		if e, err := EscapeKey(bad); err == nil {
			t.Errorf("EscapeKey(%q) = %q, want an error", bad, e)
		}
	}
	// Names EscapeKey never makes are not keys.
	for _, e := range []string{"a_2f", "a_", "a_2", "a_ZZ", "a_41", ".x", "ca.crt_"} {
		if k, ok := UnescapeKey(e); ok {
			t.Errorf("UnescapeKey(%q) = %q, want not ok", e, k)
		}
	}
}

// TestSecret runs the storage against a real kube-apiserver: certmagic's
// file semantics, and locks between two replicas.
func TestSecret(t *testing.T) {
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	newStore := func(name string, clk *testingclock.FakeClock) *Secret {
		t.Helper()
		o := Options{Namespace: "default", Name: name, LockPoll: 20 * time.Millisecond}
		if clk != nil {
			o.Clock = clk
		}
		s, err := New(cp.Client, o)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	t.Run("Files", func(t *testing.T) {
		s := newStore("acme-files", nil)
		if _, err := s.Load(ctx, "a/b"); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("Load before the Secret exists: %v", err)
		}
		if _, err := s.List(ctx, "", true); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("List before the Secret exists: %v", err)
		}
		for k, v := range map[string]string{
			"certificates/ca/gw.example.com/gw.example.com.crt": "crt",
			"certificates/ca/gw.example.com/gw.example.com.key": "key",
			"certificates/ca/other.example.com/other.json":      "{}",
			"acme/ca/users/default/default.key":                 "account",
		} {
			if err := s.Store(ctx, k, []byte(v)); err != nil {
				t.Fatal(err)
			}
		}
		if v, err := s.Load(ctx, "certificates/ca/gw.example.com/gw.example.com.key"); err != nil || string(v) != "key" {
			t.Errorf("Load = %q, %v", v, err)
		}
		info, err := s.Stat(ctx, "certificates/ca/gw.example.com/gw.example.com.crt")
		if err != nil || !info.IsTerminal || info.Size != 3 || time.Since(info.Modified) > time.Minute {
			t.Errorf("Stat(file) = %+v, %v", info, err)
		}
		if info, err := s.Stat(ctx, "certificates/ca"); err != nil || info.IsTerminal {
			t.Errorf("Stat(dir) = %+v, %v", info, err)
		}
		if !s.Exists(ctx, "certificates") || s.Exists(ctx, "certif") || s.Exists(ctx, "certificates/ca/gw") {
			t.Error("Exists must match whole path components")
		}
		list, err := s.List(ctx, "certificates/ca", false)
		if d := cmp.Diff([]string{"certificates/ca/gw.example.com", "certificates/ca/other.example.com"}, list); err != nil || d != "" {
			t.Errorf("List(non-recursive): %v %s", err, d)
		}
		list, err = s.List(ctx, "certificates", true)
		want := []string{"certificates/ca", "certificates/ca/gw.example.com", "certificates/ca/gw.example.com/gw.example.com.crt",
			"certificates/ca/gw.example.com/gw.example.com.key", "certificates/ca/other.example.com", "certificates/ca/other.example.com/other.json"}
		slices.Sort(list)
		if d := cmp.Diff(want, list); err != nil || d != "" {
			t.Errorf("List(recursive): %v %s", err, d)
		}
		if err := s.Delete(ctx, "certificates/ca/gw.example.com"); err != nil {
			t.Fatal(err)
		}
		if s.Exists(ctx, "certificates/ca/gw.example.com/gw.example.com.crt") || !s.Exists(ctx, "certificates/ca/other.example.com/other.json") {
			t.Error("Delete of a directory: wrong keys left")
		}
		if err := s.Delete(ctx, "not/there"); err != nil {
			t.Errorf("Delete of a missing key: %v", err)
		}
		// Another replica sees the same state.
		if v, err := newStore("acme-files", nil).Load(ctx, "acme/ca/users/default/default.key"); err != nil || string(v) != "account" {
			t.Errorf("second replica Load = %q, %v", v, err)
		}
	})

	t.Run("Locks", func(t *testing.T) {
		// b polls on a fake clock, so that its waiting is seen.
		clk := testingclock.NewFakeClock(time.Now())
		a, b := newStore("acme-locks", nil), newStore("acme-locks", clk)
		if err := a.Lock(ctx, "issue_cert_gw.example.com"); err != nil {
			t.Fatal(err)
		}
		// Held: b blocks until its context ends; another name is free.
		short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
		err := b.Lock(short, "issue_cert_gw.example.com")
		cancelShort()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("second Lock while held: %v, want a deadline", err)
		}
		if err := b.Lock(ctx, "issue_cert_other.example.com"); err != nil {
			t.Fatal(err)
		}
		// Released: b's blocked Lock returns.
		got := make(chan error, 1)
		waiters := clk.Waiters()
		go func() { got <- b.Lock(ctx, "issue_cert_gw.example.com") }()
		testenv.Never(t, "Lock returned while the lock was held",
			func() bool { return len(got) > 0 },
			func() bool { return clk.Waiters() > waiters }) // it tried, and waits to poll again
		if err := a.Unlock(ctx, "issue_cert_gw.example.com"); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, "Lock to return after Unlock", func() bool {
			clk.Step(20 * time.Millisecond)
			return len(got) > 0
		})
		if err := <-got; err != nil {
			t.Fatalf("Lock after Unlock: %v", err)
		}
		// A second caller of the same replica waits too.
		short, cancelShort = context.WithTimeout(ctx, 100*time.Millisecond)
		err = b.Lock(short, "issue_cert_gw.example.com")
		cancelShort()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lock by the same replica while held: %v, want a deadline", err)
		}
		for _, n := range []string{"issue_cert_gw.example.com", "issue_cert_other.example.com"} {
			if err := b.Unlock(ctx, n); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Unlock(ctx, "issue_cert_gw.example.com"); err == nil {
			t.Error("Unlock of a lock not held: no error")
		}
		sec, err := cp.Client.CoreV1().Secrets("default").Get(ctx, "acme-locks", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for k := range sec.Annotations {
			if strings.HasPrefix(k, LockAnnotationPrefix) {
				t.Errorf("lock annotation %s left after Unlock", k)
			}
		}
	})

	t.Run("StaleLockExpires", func(t *testing.T) {
		// The holder's clock stands still (it died: no refresh); the
		// other replica's clock is past the lock's TTL.
		now := time.Now()
		dead, alive := testingclock.NewFakeClock(now), testingclock.NewFakeClock(now)
		a, b := newStore("acme-stale", dead), newStore("acme-stale", alive)
		if err := a.Lock(ctx, "renew_cert_gw.example.com"); err != nil {
			t.Fatal(err)
		}
		short, cancelShort := context.WithTimeout(ctx, 200*time.Millisecond)
		err := b.Lock(short, "renew_cert_gw.example.com")
		cancelShort()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Lock before the TTL: %v, want a deadline", err)
		}
		alive.SetTime(now.Add(DefaultLockTTL + time.Second))
		if err := b.Lock(ctx, "renew_cert_gw.example.com"); err != nil {
			t.Fatalf("Lock of an expired lock: %v", err)
		}
		// The old holder's Unlock leaves the new holder's lock alone.
		if err := a.Unlock(ctx, "renew_cert_gw.example.com"); err != nil {
			t.Fatal(err)
		}
		c := newStore("acme-stale", alive)
		short, cancelShort = context.WithTimeout(ctx, 200*time.Millisecond)
		err = c.Lock(short, "renew_cert_gw.example.com")
		cancelShort()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("the expired holder's Unlock released the new holder's lock: %v", err)
		}
		// A holder that is alive refreshes its lock: after a third of the
		// TTL its expiry moves forward.
		before, _ := lockOf(t, ctx, cp, "acme-stale", "renew_cert_gw.example.com")
		alive.Step(DefaultLockTTL/3 + time.Second)
		testenv.Eventually(t, "the lock refreshed", func() bool {
			r, _ := lockOf(t, ctx, cp, "acme-stale", "renew_cert_gw.example.com")
			return r.Expires.After(before.Expires)
		})
		if err := b.Unlock(ctx, "renew_cert_gw.example.com"); err != nil {
			t.Fatal(err)
		}
	})
}

func lockOf(t *testing.T, ctx context.Context, cp *testenv.ControlPlane, secret, name string) (lockRecord, bool) {
	t.Helper()
	sec, err := cp.Client.CoreV1().Secrets("default").Get(ctx, secret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return readLock(sec, name)
}
