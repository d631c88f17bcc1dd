package poolstore

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/internal/kube"
	"github.com/tether-edge/tether/internal/ticker"
	"github.com/tether-edge/tether/poolstore/feed"
	"github.com/tether-edge/tether/poolstore/record"
	"github.com/tether-edge/tether/poolstore/replica"
)

//lint:file-ignore SA1019 core/v1 Endpoints is deprecated but still served and read by older clients; the pool shares it.

// DefaultResources are the pool-scope resources shared by default (those
// the gateway feeds by default).
var DefaultResources = feed.DefaultResources

// SyncInterval is how often the leader renews the pool's sync record
// while its replica is fresh.
const SyncInterval = 10 * time.Second

// FeedSourceOptions configure a FeedSource. Open, Verifier and Store are
// required.
type FeedSourceOptions struct {
	// Open opens the signed pool feed of a gateway replica (through the
	// tunnel: edgetunnel.Client.PoolFeed), a deflated stream of
	// feed.Frames.
	Open func(ctx context.Context) (io.ReadCloser, error)
	// Verifier checks the feed's statements.
	Verifier *feed.Verifier
	Store    *replica.Store
	// Client reads the sync record and Records writes it (as the
	// election record); with no Client the record is not kept.
	Client  *kube.Client
	Records record.Writer
	Pool    string
	Node    string
	Logger  *slog.Logger
}

// FeedSource is the leader's side of the pool's data: it takes the
// gateway's signed feed into its store (the gateway list/watches the
// cloud for every pool; the leader no longer does), verifying each unit
// as its followers will, and keeps the sync record.
type FeedSource struct {
	o FeedSourceOptions
}

// NewFeedSource returns a FeedSource; Run runs it.
func NewFeedSource(o FeedSourceOptions) *FeedSource {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &FeedSource{o: o}
}

// Run takes the feed until ctx ends (the leader's term), opening it again
// with backoff when it ends.
func (s *FeedSource) Run(ctx context.Context) {
	go s.keepSyncRecord(ctx)
	backoff := time.Second
	for ctx.Err() == nil {
		started := time.Now()
		err := s.take(ctx)
		if ctx.Err() != nil {
			return
		}
		if time.Since(started) > time.Minute {
			backoff = time.Second
		}
		s.o.Logger.Info("pool feed ended; opening it again", "err", err, "in", backoff)
		if !ticker.Sleep(ctx, nil, backoff+rand.N(backoff/2)) {
			return
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// unit is a unit of the feed being received.
type unit struct {
	resource string
	replace  bool
	items    []feed.Item
}

// take reads one feed stream into the store until it ends.
func (s *FeedSource) take(ctx context.Context) error {
	rc, err := s.o.Open(ctx)
	if err != nil {
		return fmt.Errorf("open pool feed: %w", err)
	}
	defer rc.Close()
	stop := context.AfterFunc(ctx, func() { rc.Close() })
	defer stop()
	r := feed.NewReader(rc)
	var u *unit
	for {
		fr, _, err := r.Next()
		if err != nil {
			return err
		}
		switch fr.Type {
		case feed.FrameCerts:
			if err := s.o.Verifier.AddChain(fr.Chain); err != nil {
				return fmt.Errorf("the gateway's certificate: %w", err)
			}
			s.o.Store.SetChains(s.o.Verifier.Chains())
		case feed.FrameUnit:
			if u == nil {
				u = &unit{resource: fr.Resource, replace: fr.Replace}
			} else if u.resource != fr.Resource || fr.Replace {
				return fmt.Errorf("pool feed: a unit of %s inside one of %s", fr.Resource, u.resource)
			}
			u.items = append(u.items, fr.Items...)
			if fr.Attest.IsZero() {
				continue
			}
			if err := s.apply(u, fr.Attest); err != nil {
				return err
			}
			u = nil
		case feed.FrameMark:
			if err := s.mark(fr.Mark); err != nil {
				return err
			}
		}
	}
}

// apply verifies a unit's attestation, applies its items and records the
// attestation, which the objects must then hash to.
func (s *FeedSource) apply(u *unit, attest feed.Signed) error {
	h, err := s.o.Verifier.OpenKind(attest, feed.KindAttest)
	if err != nil {
		return fmt.Errorf("pool feed unit of %s: %w", u.resource, err)
	}
	if h.Resource != u.resource {
		return fmt.Errorf("pool feed: an attestation of %s closing a unit of %s", h.Resource, u.resource)
	}
	raw, err := json.Marshal(attest)
	if err != nil {
		return err
	}
	store := s.o.Store
	if u.replace {
		objs := make([]json.RawMessage, len(u.items))
		for i, it := range u.items {
			objs[i] = it.Object
		}
		if err := store.Replace(u.resource, objs, h.To); err != nil {
			return err
		}
	} else {
		for _, it := range u.items {
			if err := store.Apply(u.resource, it.Type, it.Object); err != nil {
				return err
			}
		}
	}
	if err := store.Attest(u.resource, raw, h); err != nil {
		// The gateway's state and this replica's differ (an event older
		// than the replica's object): the feed starts over with whole
		// resources.
		return err
	}
	return nil
}

// mark takes a signed mark: the replica is synced at its time if it
// covers it.
func (s *FeedSource) mark(m feed.Signed) error {
	h, err := s.o.Verifier.OpenKind(m, feed.KindMark)
	if err != nil {
		return fmt.Errorf("pool feed mark: %w", err)
	}
	if !s.o.Store.Covers(h.Resources) {
		return nil // a unit still on its way; the next mark will do
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return err
	}
	s.o.Store.SetMark(raw, h.T)
	return nil
}

// keepSyncRecord renews the pool's sync record every SyncInterval while
// the replica is fresh (tetherctl pools shows it).
func (s *FeedSource) keepSyncRecord(ctx context.Context) {
	if s.o.Client == nil {
		return
	}
	var last time.Time
	ticker.Every(ctx, nil, time.Second, func() bool {
		at := s.o.Store.SyncedAt()
		if at.IsZero() || time.Since(at) > DefaultFreshFor || time.Since(last) < SyncInterval {
			return true
		}
		last = time.Now()
		if err := s.renewSyncRecord(ctx, at); err != nil && ctx.Err() == nil {
			s.o.Logger.Warn("pool sync record not renewed", "err", err)
		}
		return true
	})
}

// renewSyncRecord writes the leader-informer-sync record,
// record.Namespace/record.SyncName(pool): a ConfigMap naming this node and
// the time its replica was last synced. It is read with Client and
// written with Records, as the election record is.
func (s *FeedSource) renewSyncRecord(ctx context.Context, at time.Time) error {
	cms := s.o.Client.ConfigMaps(record.Namespace)
	w := s.o.Records
	if w == nil {
		w = record.ClientWriter{ConfigMaps: cms}
	}
	name := record.SyncName(s.o.Pool)
	data := record.Sync{HolderIdentity: s.o.Node, RenewTime: at, LeaseDurationSeconds: record.SyncLeaseSeconds}.Data()
	cm, err := cms.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: record.Namespace}, Data: data}
		_, err = w.WriteRecord(ctx, record.Write{Kind: record.KindSync, Pool: s.o.Pool, Create: true, ConfigMap: cm})
		return err
	}
	if err != nil {
		return err
	}
	cm.Data = data
	_, err = w.WriteRecord(ctx, record.Write{Kind: record.KindSync, Pool: s.o.Pool, ConfigMap: cm})
	return err
}
