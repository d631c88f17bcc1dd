package dns

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/tether-edge/tether/gateway/nodewatch"
)

// DefaultHostsKey is the ConfigMap key OpenYurt's yurt-tunnel-dns setup
// mounts as a hosts file for CoreDNS's hosts plugin.
const DefaultHostsKey = "tunnel-nodes"

// HostsOptions configure a HostsWriter.
type HostsOptions struct {
	// Namespace and Name of the ConfigMap (--hosts-configmap ns/name).
	Namespace, Name string
	// Key holds the hosts lines; "" means DefaultHostsKey.
	Key string
	// Mode and CloudNodes select the names and addresses as for the DNS
	// server: the ConfigMap lists what the server answers.
	Mode       nodewatch.Mode
	CloudNodes bool
	// Logger receives the writer's logs; nil discards them.
	Logger *slog.Logger
	// Clock times the retries after a failed write; nil means real time.
	Clock clock.Clock
}

// HostsWriter keeps a ConfigMap with one "<ip>\t<node>" line per address
// that the DNS server answers, sorted by node name, for users of CoreDNS's
// hosts plugin (OpenYurt-compatible). Names are exact node names; the
// content is rendered whole from each snapshot, never patched line by
// line, and the ConfigMap is written only when its content changes.
type HostsWriter struct {
	client kubernetes.Interface
	opts   HostsOptions
	log    *slog.Logger

	want atomic.Pointer[string] // latest rendered content
	kick chan struct{}
}

// ParseConfigMapRef splits the value of --hosts-configmap, "<ns>/<name>".
func ParseConfigMapRef(s string) (namespace, name string, err error) {
	namespace, name, ok := strings.Cut(s, "/")
	if !ok || namespace == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("configmap %q: want <namespace>/<name>", s)
	}
	return namespace, name, nil
}

// NewHostsWriter returns a writer; call Run to start it and Update to feed
// it snapshots.
func NewHostsWriter(client kubernetes.Interface, opts HostsOptions) *HostsWriter {
	if opts.Key == "" {
		opts.Key = DefaultHostsKey
	}
	if opts.Mode == "" {
		opts.Mode = nodewatch.ModeNodeIP
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &HostsWriter{
		client: client,
		opts:   opts,
		log:    opts.Logger.With("configmap", opts.Namespace+"/"+opts.Name),
		kick:   make(chan struct{}, 1),
	}
}

// Update renders snap; Run writes it if it differs from what it wrote
// last. It does not block.
func (h *HostsWriter) Update(snap *nodewatch.Snapshot) {
	content := renderHosts(records(snap, h.opts.Mode, h.opts.CloudNodes))
	if old := h.want.Swap(&content); old != nil && *old == content {
		return
	}
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// renderHosts renders hosts lines in the order of rs, addresses in the
// order they are answered.
func renderHosts(rs []record) string {
	var b strings.Builder
	for _, r := range rs {
		for _, a := range r.addrs {
			b.WriteString(a.String())
			b.WriteByte('\t')
			b.WriteString(r.node)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// Run writes the latest content until ctx is done, then returns nil. A
// failed write is retried with backoff (1 s doubling to 1 min), always with
// the latest content.
func (h *HostsWriter) Run(ctx context.Context) error {
	var (
		written string // content of the last successful write
		wrote   bool
		backoff time.Duration
	)
	for {
		var retry <-chan time.Time
		if backoff > 0 {
			retry = h.opts.Clock.After(backoff)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-h.kick:
		case <-retry:
		}
		want := h.want.Load()
		if want == nil || wrote && *want == written {
			continue
		}
		if err := h.write(ctx, *want); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			backoff = min(max(2*backoff, time.Second), time.Minute)
			h.log.Warn("write hosts configmap", "err", err, "retryIn", backoff)
			continue
		}
		written, wrote, backoff = *want, true, 0
	}
}

// write makes the ConfigMap's key hold content, creating the ConfigMap if
// needed and leaving its other keys alone.
func (h *HostsWriter) write(ctx context.Context, content string) error {
	cms := h.client.CoreV1().ConfigMaps(h.opts.Namespace)
	cm, err := cms.Get(ctx, h.opts.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		cm = &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: h.opts.Namespace, Name: h.opts.Name},
			Data:       map[string]string{h.opts.Key: content},
		}
		if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create: %w", err)
		}
		h.log.Info("created hosts configmap", "lines", strings.Count(content, "\n"))
		return nil
	}
	if err != nil {
		return fmt.Errorf("get: %w", err)
	}
	if v, ok := cm.Data[h.opts.Key]; ok && v == content {
		return nil
	}
	cm = cm.DeepCopy()
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data[h.opts.Key] = content
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update: %w", err)
	}
	h.log.Debug("updated hosts configmap", "lines", strings.Count(content, "\n"))
	return nil
}
