// Package acmestore is a certmagic.Storage in one Kubernetes Secret, so
// that the gateway's replicas share one ACME account and one certificate
// per name (--acme-storage secret:<namespace>/<name>).
//
// Each certmagic key ("certificates/<ca>/<name>/<name>.crt") is one entry
// of the Secret's data, its name escaped (EscapeKey) to the characters a
// data key may hold: letters, digits, '-' and '.' stay; every other byte,
// '/' and '_' included, becomes '_' and two upper-case hex digits ("/" ->
// "_2F"); a leading '.' is escaped too, since a data key may not start
// with "..". Escaped names are at most 253 characters; a longer key is an
// error. Directories are implicit: a key is a directory when it prefixes
// an entry at a '/' boundary. The modification time of each entry is kept
// in the annotation acme.tether.io/modified (a JSON map of entry to
// RFC 3339 time).
//
// Locks (certmagic's Locker: one holder per name across every replica)
// are annotations of the same Secret, acme.tether.io/lock-<hash of the
// name>, whose value records the name, a random token of the holder and an
// expiry. Lock writes one with an update that carries the Secret's
// resourceVersion, so of two replicas racing for a lock exactly one
// update succeeds; the other sees it held and polls (Options.LockPoll)
// until it is released or expires. The holder pushes the expiry forward
// every third of Options.LockTTL while it holds the lock, so a lock
// expires only when its holder died (or lost the apiserver) for LockTTL;
// then the next Lock takes it over. Expiry is judged with each replica's
// own clock: LockTTL must exceed the clock skew between replicas.
//
// Every write is a get and an update (or a create when the Secret does not
// exist yet) retried on conflict, so the gateway needs get, create and
// update on the Secret and nothing else (packaging/kubernetes/gateway-rbac.yaml).
// A Secret holds at most 1 MiB: an ACME account and a few certificates
// take a few KiB.
package acmestore

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/certmagic"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/tether-edge/tether/internal/ticker"
)

// Annotations of the Secret.
const (
	// ModifiedAnnotation holds the entries' modification times.
	ModifiedAnnotation = "acme.tether.io/modified"
	// LockAnnotationPrefix starts the annotation of each lock.
	LockAnnotationPrefix = "acme.tether.io/lock-"
)

// Defaults for Options.
const (
	DefaultLockTTL  = 30 * time.Second
	DefaultLockPoll = time.Second
)

// Options configure New.
type Options struct {
	// Namespace and Name of the Secret; it is created when missing.
	Namespace, Name string
	// LockTTL is how long a lock outlives its holder's last refresh; 0
	// means DefaultLockTTL.
	LockTTL time.Duration
	// LockPoll is how often a blocked Lock looks again; 0 means
	// DefaultLockPoll.
	LockPoll time.Duration
	// Clock; nil means the real clock.
	Clock clock.WithTicker
	// Logger; nil discards.
	Logger *slog.Logger
}

// Secret is the storage. It is safe for concurrent use.
type Secret struct {
	client kubernetes.Interface
	opts   Options
	clock  clock.WithTicker
	log    *slog.Logger

	mu   sync.Mutex
	held map[string]*heldLock // lock name -> this Secret's hold on it
}

type heldLock struct {
	token string
	stop  context.CancelFunc
	done  chan struct{}
}

var _ certmagic.Storage = (*Secret)(nil)

// New returns the storage of the Secret opts.Namespace/opts.Name. It does
// not touch the apiserver.
func New(client kubernetes.Interface, opts Options) (*Secret, error) {
	if opts.Namespace == "" || opts.Name == "" {
		return nil, errors.New("acme storage: Secret namespace and name are required")
	}
	if msgs := validation.IsDNS1123Subdomain(opts.Name); len(msgs) > 0 {
		return nil, fmt.Errorf("acme storage: Secret name %q: %s", opts.Name, strings.Join(msgs, "; "))
	}
	if opts.LockTTL <= 0 {
		opts.LockTTL = DefaultLockTTL
	}
	if opts.LockPoll <= 0 {
		opts.LockPoll = DefaultLockPoll
	}
	s := &Secret{client: client, opts: opts, clock: opts.Clock, log: opts.Logger, held: map[string]*heldLock{}}
	if s.clock == nil {
		s.clock = clock.RealClock{}
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	return s, nil
}

// String names the Secret, for logs.
func (s *Secret) String() string { return "secret:" + s.opts.Namespace + "/" + s.opts.Name }

// EscapeKey maps a certmagic key to the name of its data entry (see the
// package doc).
func EscapeKey(key string) (string, error) {
	if key == "" {
		return "", errors.New("empty key")
	}
	var b strings.Builder
	for i := 0; i < len(key); i++ {
		c := key[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' && i > 0 {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "_%02X", c)
	}
	e := b.String()
	if msgs := validation.IsConfigMapKey(e); len(msgs) > 0 {
		return "", fmt.Errorf("key %q: escaped as %q: %s", key, e, strings.Join(msgs, "; "))
	}
	return e, nil
}

// UnescapeKey is the inverse of EscapeKey; ok is false for a name
// EscapeKey never makes.
func UnescapeKey(e string) (key string, ok bool) {
	var b strings.Builder
	for i := 0; i < len(e); i++ {
		if e[i] != '_' {
			b.WriteByte(e[i])
			continue
		}
		if i+2 >= len(e) {
			return "", false
		}
		v, err := hex.DecodeString(e[i+1 : i+3])
		if err != nil || strings.ToUpper(e[i+1:i+3]) != e[i+1:i+3] {
			return "", false
		}
		b.WriteByte(v[0])
		i += 2
	}
	key = b.String()
	if again, err := EscapeKey(key); err != nil || again != e {
		return "", false
	}
	return key, true
}

// get returns the Secret, or nil when it does not exist.
func (s *Secret) get(ctx context.Context) (*corev1.Secret, error) {
	sec, err := s.client.CoreV1().Secrets(s.opts.Namespace).Get(ctx, s.opts.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get Secret %s/%s: %w", s.opts.Namespace, s.opts.Name, err)
	}
	return sec, nil
}

// modify applies change to the current Secret (a new one when it does
// not exist) and writes it if change says so, retrying from a fresh read
// on a conflict.
func (s *Secret) modify(ctx context.Context, change func(*corev1.Secret) (bool, error)) error {
	for {
		sec, err := s.get(ctx)
		if err != nil {
			return err
		}
		create := sec == nil
		if create {
			sec = &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{
					Namespace: s.opts.Namespace,
					Name:      s.opts.Name,
					Labels:    map[string]string{"app.kubernetes.io/managed-by": "tether-gateway"},
				},
				Type: corev1.SecretTypeOpaque,
			}
		}
		write, err := change(sec)
		if err != nil || !write {
			return err
		}
		secrets := s.client.CoreV1().Secrets(s.opts.Namespace)
		if create {
			_, err = secrets.Create(ctx, sec, metav1.CreateOptions{})
		} else {
			_, err = secrets.Update(ctx, sec, metav1.UpdateOptions{})
		}
		switch {
		case err == nil:
			return nil
		case apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err):
			if ctx.Err() != nil {
				return ctx.Err()
			}
			continue
		default:
			verb := "update"
			if create {
				verb = "create"
			}
			return fmt.Errorf("%s Secret %s/%s: %w", verb, s.opts.Namespace, s.opts.Name, err)
		}
	}
}

// keys returns the certmagic keys of the Secret's entries, sorted.
func keys(sec *corev1.Secret) []string {
	if sec == nil {
		return nil
	}
	var ks []string
	for e := range sec.Data {
		if k, ok := UnescapeKey(e); ok {
			ks = append(ks, k)
		}
	}
	slices.Sort(ks)
	return ks
}

// under reports whether key is dir or inside it ("" is the root).
func under(key, dir string) bool {
	return dir == "" || key == dir || strings.HasPrefix(key, dir+"/")
}

func modified(sec *corev1.Secret) map[string]time.Time {
	m := map[string]time.Time{}
	if v := sec.Annotations[ModifiedAnnotation]; v != "" {
		json.Unmarshal([]byte(v), &m) // a damaged map only loses times
	}
	return m
}

func setModified(sec *corev1.Secret, m map[string]time.Time) {
	if sec.Annotations == nil {
		sec.Annotations = map[string]string{}
	}
	b, _ := json.Marshal(m)
	sec.Annotations[ModifiedAnnotation] = string(b)
}

// Store puts value at key.
func (s *Secret) Store(ctx context.Context, key string, value []byte) error {
	e, err := EscapeKey(key)
	if err != nil {
		return fmt.Errorf("acme storage %s: %w", s, err)
	}
	return s.modify(ctx, func(sec *corev1.Secret) (bool, error) {
		if sec.Data == nil {
			sec.Data = map[string][]byte{}
		}
		sec.Data[e] = value
		m := modified(sec)
		m[e] = s.clock.Now().UTC()
		setModified(sec, m)
		return true, nil
	})
}

// Load returns the value at key, or fs.ErrNotExist.
func (s *Secret) Load(ctx context.Context, key string) ([]byte, error) {
	e, err := EscapeKey(key)
	if err != nil {
		return nil, fs.ErrNotExist
	}
	sec, err := s.get(ctx)
	if err != nil {
		return nil, err
	}
	if sec == nil {
		return nil, fs.ErrNotExist
	}
	v, ok := sec.Data[e]
	if !ok {
		return nil, fs.ErrNotExist
	}
	return v, nil
}

// Delete removes key and, when it is a directory, every key inside it. A
// missing key is no error.
func (s *Secret) Delete(ctx context.Context, key string) error {
	key = strings.Trim(key, "/")
	return s.modify(ctx, func(sec *corev1.Secret) (bool, error) {
		m := modified(sec)
		n := 0
		for e := range sec.Data {
			if k, ok := UnescapeKey(e); ok && under(k, key) {
				delete(sec.Data, e)
				delete(m, e)
				n++
			}
		}
		if n == 0 {
			return false, nil
		}
		setModified(sec, m)
		return true, nil
	})
}

// Exists reports whether key is an entry or a directory.
func (s *Secret) Exists(ctx context.Context, key string) bool {
	_, err := s.Stat(ctx, key)
	return err == nil
}

// List returns the keys inside dir: its entries and directories, or with
// recursive every entry and directory below it.
func (s *Secret) List(ctx context.Context, dir string, recursive bool) ([]string, error) {
	dir = strings.Trim(dir, "/")
	sec, err := s.get(ctx)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []string
	add := func(k string) {
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	found := false
	for _, k := range keys(sec) {
		if !under(k, dir) || k == dir {
			continue
		}
		found = true
		rest := strings.TrimPrefix(k, dir)
		rest = strings.TrimPrefix(rest, "/")
		parts := strings.Split(rest, "/")
		if !recursive {
			add(path.Join(dir, parts[0]))
			continue
		}
		for i := range parts {
			add(path.Join(dir, path.Join(parts[:i+1]...)))
		}
	}
	if !found {
		return nil, fs.ErrNotExist
	}
	return out, nil
}

// Stat describes key: an entry, or a directory.
func (s *Secret) Stat(ctx context.Context, key string) (certmagic.KeyInfo, error) {
	key = strings.Trim(key, "/")
	sec, err := s.get(ctx)
	if err != nil {
		return certmagic.KeyInfo{}, err
	}
	if sec == nil {
		return certmagic.KeyInfo{}, fs.ErrNotExist
	}
	if e, err := EscapeKey(key); err == nil {
		if v, ok := sec.Data[e]; ok {
			return certmagic.KeyInfo{Key: key, Modified: modified(sec)[e], Size: int64(len(v)), IsTerminal: true}, nil
		}
	}
	for _, k := range keys(sec) {
		if under(k, key) {
			return certmagic.KeyInfo{Key: key, IsTerminal: false}, nil
		}
	}
	return certmagic.KeyInfo{}, fs.ErrNotExist
}

// lockRecord is the value of a lock annotation.
type lockRecord struct {
	Name    string    `json:"name"`
	Token   string    `json:"token"`
	Expires time.Time `json:"expires"`
}

// LockAnnotation is the annotation that holds the lock of name.
func LockAnnotation(name string) string {
	sum := sha256.Sum256([]byte(name))
	return LockAnnotationPrefix + hex.EncodeToString(sum[:10])
}

func readLock(sec *corev1.Secret, name string) (lockRecord, bool) {
	var r lockRecord
	v, ok := sec.Annotations[LockAnnotation(name)]
	if !ok || json.Unmarshal([]byte(v), &r) != nil {
		return lockRecord{}, false
	}
	return r, true
}

func writeLock(sec *corev1.Secret, r lockRecord) {
	if sec.Annotations == nil {
		sec.Annotations = map[string]string{}
	}
	b, _ := json.Marshal(r)
	sec.Annotations[LockAnnotation(r.Name)] = string(b)
}

// Lock blocks until this caller holds the lock name, or ctx ends. A lock
// held by anyone (another replica, or another caller of this process) is
// waited for until it is released or expires.
func (s *Secret) Lock(ctx context.Context, name string) error {
	token := rand.Text()
	var poll clock.Timer
	for {
		acquired, err := s.tryLock(ctx, name, token)
		if err != nil {
			return fmt.Errorf("acme storage %s: lock %q: %w", s, name, err)
		}
		if acquired {
			return nil
		}
		if poll == nil {
			poll = s.clock.NewTimer(s.opts.LockPoll)
			defer poll.Stop()
		} else {
			poll.Reset(s.opts.LockPoll)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("acme storage %s: lock %q: %w", s, name, ctx.Err())
		case <-poll.C():
		}
	}
}

func (s *Secret) tryLock(ctx context.Context, name, token string) (bool, error) {
	s.mu.Lock()
	_, busy := s.held[name]
	s.mu.Unlock()
	if busy {
		return false, nil // another caller of this process holds it
	}
	var acquired bool
	err := s.modify(ctx, func(sec *corev1.Secret) (bool, error) {
		acquired = false
		now := s.clock.Now()
		if r, ok := readLock(sec, name); ok && now.Before(r.Expires) {
			return false, nil
		} else if ok {
			s.log.Warn("ACME storage: taking over an expired lock", "lock", name, "expired", r.Expires)
		}
		writeLock(sec, lockRecord{Name: name, Token: token, Expires: now.Add(s.opts.LockTTL).UTC()})
		acquired = true
		return true, nil
	})
	if err != nil || !acquired {
		return false, err
	}
	// The apiserver serialized the write (resourceVersion): no other
	// caller, here or elsewhere, holds the lock now.
	s.mu.Lock()
	defer s.mu.Unlock()
	rctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	h := &heldLock{token: token, stop: stop, done: make(chan struct{})}
	s.held[name] = h
	go s.refresh(rctx, name, h)
	return true, nil
}

// refresh pushes the lock's expiry forward every third of LockTTL until
// Unlock stops it or the lock is found taken.
func (s *Secret) refresh(ctx context.Context, name string, h *heldLock) {
	defer close(h.done)
	ticker.Every(ctx, s.clock, s.opts.LockTTL/3, func() bool {
		lost := false
		err := s.modify(ctx, func(sec *corev1.Secret) (bool, error) {
			r, ok := readLock(sec, name)
			if !ok || r.Token != h.token {
				lost = true
				return false, nil
			}
			r.Expires = s.clock.Now().Add(s.opts.LockTTL).UTC()
			writeLock(sec, r)
			return true, nil
		})
		switch {
		case lost:
			s.log.Error("ACME storage: a lock this replica holds was taken over (it was not refreshed in time)", "lock", name)
			return false
		case err != nil && ctx.Err() == nil:
			s.log.Warn("ACME storage: refreshing a lock", "lock", name, "err", err)
		}
		return true
	})
}

// Unlock releases a lock Lock acquired.
func (s *Secret) Unlock(ctx context.Context, name string) error {
	s.mu.Lock()
	h, ok := s.held[name]
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("acme storage %s: unlock %q: not locked", s, name)
	}
	h.stop()
	<-h.done
	err := s.modify(ctx, func(sec *corev1.Secret) (bool, error) {
		if r, ok := readLock(sec, name); !ok || r.Token != h.token {
			return false, nil // expired and taken over, or gone
		}
		delete(sec.Annotations, LockAnnotation(name))
		return true, nil
	})
	s.mu.Lock()
	delete(s.held, name)
	s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("acme storage %s: unlock %q: %w", s, name, err)
	}
	return nil
}
