package poolstore

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
)

// ElectionOptions configure an Elector. The durations default to 15 s,
// 10 s and 2 s (client-go's leader election defaults).
type ElectionOptions struct {
	// Client reaches the cloud apiserver with the node's identity.
	Client kubernetes.Interface
	Pool   string
	// Node is this node's name: its identity in the Lease.
	Node          string
	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration
	Logger        *slog.Logger
}

// Elector runs the pool's leader election (client-go leaderelection) on
// the record LeaseNamespace/LeaseName(pool) in the cloud: only a node that
// reaches the cloud can hold it. See lock.go for why the record is a
// ConfigMap.
type Elector struct {
	o ElectionOptions

	mu      sync.Mutex
	leader  string
	leading bool
	changed chan struct{}
}

// NewElector checks o and returns an Elector; Run runs it.
func NewElector(o ElectionOptions) (*Elector, error) {
	if o.Client == nil || o.Pool == "" || o.Node == "" {
		return nil, fmt.Errorf("pool election: Client, Pool and Node are required")
	}
	if o.LeaseDuration <= 0 {
		o.LeaseDuration = 15 * time.Second
	}
	if o.RenewDeadline <= 0 {
		o.RenewDeadline = 10 * time.Second
	}
	if o.RetryPeriod <= 0 {
		o.RetryPeriod = 2 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Elector{o: o, changed: make(chan struct{})}, nil
}

// Run campaigns until ctx ends. lead runs while this node leads; its
// context ends when the lease is lost (lead must then stop acting as
// leader). On ctx's end the Lease is released, so that another node takes
// over at once.
func (e *Elector) Run(ctx context.Context, lead func(ctx context.Context)) error {
	lock := &configMapLock{client: e.o.Client, name: LeaseName(e.o.Pool), identity: e.o.Node}
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   e.o.LeaseDuration,
			RenewDeadline:   e.o.RenewDeadline,
			RetryPeriod:     e.o.RetryPeriod,
			ReleaseOnCancel: true,
			Name:            LeaseName(e.o.Pool),
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(ctx context.Context) {
					e.set(e.o.Node, true)
					e.o.Logger.Info("pool leader: this node leads")
					lead(ctx)
				},
				OnStoppedLeading: func() {
					e.mu.Lock()
					was := e.leading
					e.mu.Unlock()
					if was {
						e.o.Logger.Info("pool leader: this node no longer leads")
						e.set("", false)
					}
				},
				OnNewLeader: func(identity string) {
					if identity != e.o.Node {
						e.o.Logger.Info("pool leader", "leader", identity)
						e.set(identity, false)
					}
				},
			},
		})
		if err != nil {
			return fmt.Errorf("pool election: %w", err)
		}
		le.Run(ctx) // returns when leadership is lost or ctx ends
	}
	return nil
}

func (e *Elector) set(leader string, leading bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.leader == leader && e.leading == leading {
		return
	}
	e.leader, e.leading = leader, leading
	close(e.changed)
	e.changed = make(chan struct{})
}

// Leader is the leader as last seen in the Lease ("" if none seen), and
// whether it is this node.
func (e *Elector) Leader() (string, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.leader, e.leading
}

// Changed is closed at the next change of Leader.
func (e *Elector) Changed() <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.changed
}
