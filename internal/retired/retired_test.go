package retired

import (
	"context"
	"crypto/x509"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/tether-edge/tether/internal/testenv"
)

func TestRetires(t *testing.T) {
	at := time.Date(2026, 11, 29, 1, 50, 0, 0, time.UTC)
	s, err := FromConfigMap(&corev1.ConfigMap{Data: map[string]string{"edge-1": Format(at), "edge-2": "yesterday"}})
	if err == nil {
		t.Error("a value that does not parse is not reported")
	}
	cert := func(nb time.Time) *x509.Certificate { return &x509.Certificate{NotBefore: nb} }
	for _, tc := range []struct {
		node string
		nb   time.Time
		want bool
	}{
		{"edge-1", at.Add(-time.Hour), true},
		{"edge-1", at, true},
		{"edge-1", at.Add(time.Second), false}, // a new machine's
		{"edge-2", at.Add(100 * 365 * 24 * time.Hour), true},
		{"edge-3", at.Add(-time.Hour), false},
	} {
		if got := s.Retires(tc.node, cert(tc.nb)); got != tc.want {
			t.Errorf("Retires(%s, NotBefore %v) = %v, want %v", tc.node, tc.nb, got, tc.want)
		}
	}
	if got := Format(at.Add(300 * time.Millisecond).In(time.FixedZone("x", 3600))); got != "2026-11-29T01:50:00Z" {
		t.Errorf("Format = %q", got)
	}
}

// The watcher follows the one ConfigMap and calls OnChange after each
// change.
func TestWatcher(t *testing.T) {
	client := fake.NewClientset()
	w := NewWatcher(client, 0, nil)
	var changes atomic.Int32
	w.OnChange(func() { changes.Add(1) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.Run(ctx)
	testenv.Eventually(t, "synced", w.HasSynced)
	old := &x509.Certificate{NotBefore: time.Now().Add(-time.Hour)}
	if w.Retired("edge-1", old) {
		t.Fatal("retired before any record")
	}
	cms := client.CoreV1().ConfigMaps(Namespace)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: ConfigMap, Namespace: Namespace}, Data: map[string]string{"edge-1": Format(time.Now())}}
	if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "edge-1 retired", func() bool { return w.Retired("edge-1", old) && changes.Load() == 1 })
	if err := cms.Delete(ctx, ConfigMap, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the record's deletion seen", func() bool { return !w.Retired("edge-1", old) && changes.Load() == 2 })
}
