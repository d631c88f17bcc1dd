package poolfeed

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/tether-edge/tether/gateway/poolcheck"
	"github.com/tether-edge/tether/internal/ticker"
	"github.com/tether-edge/tether/tunnel"
)

// DefaultLeaderRecheck is how often, by default, the sender of a feed
// being served is checked again to still lead its pool.
const DefaultLeaderRecheck = 10 * time.Second

// HandlerOptions configure NewHandler.
type HandlerOptions struct {
	// Check is the pool leader check the delegated heartbeats and the
	// election records use.
	Check poolcheck.Checker
	// Limit is how many refusals a sender may draw before it is answered
	// tunnel.RateLimited; zero means poolcheck.DefaultLimit.
	Limit poolcheck.Limit
	// LeaderRecheck: 0 means DefaultLeaderRecheck.
	LeaderRecheck time.Duration
	// Now is the clock of the leader check; nil means time.Now.
	Now    func() time.Time
	Logger *slog.Logger
}

// Handler answers the edges' pool feed requests (tunnel.PoolFeedRequest)
// for the tunnel server: a sender that is in the pool it names and holds
// its election record, unexpired, gets the feed (Feed.Serve) until it no
// longer does, checked every LeaderRecheck; any other is refused with the
// check's code (NotLeader, LeaderExpired, NotInPool, OtherPool,
// UnknownNode, Unavailable, RateLimited). A check that fails with
// Unavailable while the feed is served (the gateway's own trouble) does
// not end it.
type Handler struct {
	feed  *Feed
	o     HandlerOptions
	limit *poolcheck.Limiter
	log   *slog.Logger
}

// NewHandler returns a Handler serving f.
func NewHandler(f *Feed, o HandlerOptions) *Handler {
	o.LeaderRecheck = cmp.Or(o.LeaderRecheck, DefaultLeaderRecheck)
	if o.Now == nil {
		o.Now = time.Now
	}
	h := &Handler{feed: f, o: o, limit: poolcheck.NewLimiter(o.Limit, nil), log: o.Logger}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	return h
}

// errLeadLost ends a feed whose sender no longer leads its pool.
var errLeadLost = errors.New("pool feed: the sender no longer leads its pool")

// ServePoolFeed checks req from sender, the node named by the edge's
// verified client certificate, and answers with reply: a refusal, after
// which it returns nil, or OK, after which it writes the feed to w until
// ctx ends, the sender no longer leads, or a write fails.
func (h *Handler) ServePoolFeed(ctx context.Context, sender string, req tunnel.PoolFeedRequest, w io.Writer, reply func(tunnel.Reply) error) error {
	log := h.log.With("node", sender, "pool", req.Pool)
	err := h.limit.Allow(sender)
	if err == nil {
		err = h.check(ctx, sender, req.Pool)
	}
	if r := poolcheck.AsRefusal(err); r != nil {
		h.feed.refusals.WithLabelValues(r.Code.String()).Inc()
		level := slog.LevelWarn
		if r.Code == tunnel.RateLimited {
			level = slog.LevelDebug
		}
		log.Log(ctx, level, "pool feed refused", "reason", r.Code.String(), "err", r.Msg)
		if h.limit.Refused(sender, r.Code) {
			log.Warn("sender refused too often: its pool feed requests are answered rate_limited for a while")
		}
		return reply(tunnel.Reply{Code: r.Code, Message: r.Msg})
	}
	if err := reply(tunnel.Reply{Code: tunnel.OK}); err != nil {
		return err
	}
	log.Info("pool feed subscribed")
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go ticker.Every(ctx, nil, h.o.LeaderRecheck, func() bool {
		if r := poolcheck.AsRefusal(h.check(ctx, sender, req.Pool)); r != nil && r.Code != tunnel.Unavailable {
			cancel(fmt.Errorf("%w: %s", errLeadLost, r))
			return false
		}
		return true
	})
	err = h.feed.Serve(ctx, w)
	log.Info("pool feed ended", "err", err)
	return err
}

// check refuses unless sender is in pool and leads it.
func (h *Handler) check(ctx context.Context, sender, pool string) error {
	if err := h.o.Check.Member(ctx, sender, pool); err != nil {
		return err
	}
	return h.o.Check.Leader(ctx, sender, pool, h.o.Now())
}
