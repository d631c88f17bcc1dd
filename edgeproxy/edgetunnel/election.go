package edgetunnel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/tether-edge/tether/poolstore/record"
	"github.com/tether-edge/tether/tunnel"
)

// ElectionRefusedError is a gateway's refusal to write an election
// record.
type ElectionRefusedError struct {
	Gateway string // the replica's address
	Pool    string
	Record  tunnel.RecordKind
	// Code says why: tunnel.Conflict (the record changed since the
	// version the write was based on), BadRecord, NotHolder, NotLeader,
	// LeaderExpired, NotInPool, OtherPool, UnknownNode, Unavailable or
	// BadRequest.
	Code    tunnel.Code
	Message string // the gateway's detail
}

func (e *ElectionRefusedError) Error() string {
	s := fmt.Sprintf("gateway %s refused to write pool %s's %s record: %s", e.Gateway, e.Pool, e.Record, e.Code)
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// WriteElectionRecord asks a gateway to create or update a record of this
// node's pool (req): node identities may only read them, and the gateway
// writes one only for a node of that pool that the record names. It
// returns the record as stored (a ConfigMap as JSON), whose
// resourceVersion the next update must name.
//
// Replicas are tried as DelegateHeartbeat tries them: lowest RTT first,
// the next one when a stream fails or a replica answers Unavailable;
// each attempt is bounded by Options.HeartbeatTimeout. A refusal is
// returned as an *ElectionRefusedError (errors.As); with no replica
// connected the error wraps ErrNoGateway.
func (c *Client) WriteElectionRecord(ctx context.Context, req tunnel.ElectionRequest) ([]byte, error) {
	what := fmt.Sprintf("%s pool %s's %s record", req.Op, req.Pool, req.Record)
	raw, err := tunnel.AppendElectionRequest(nil, req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	var stored []byte
	err = c.eachGateway(ctx, func(r *replica) error {
		err := r.roundTrip(ctx, raw, func(rd io.Reader) error {
			rep, err := tunnel.ReadElectionReply(rd)
			stored = rep.ConfigMap
			return err
		})
		var re *tunnel.RefusedError
		if errors.As(err, &re) {
			err = &ElectionRefusedError{Gateway: r.ep.addr.String(), Pool: req.Pool, Record: req.Record, Code: re.Code, Message: re.Message}
		}
		c.metrics.election(err)
		if err == nil {
			r.log.Debug("election record written", "pool", req.Pool, "record", req.Record.String(), "op", req.Op.String())
		}
		return err
	}, func(r *replica, err error) {
		r.log.Debug("election record not written; trying another gateway replica", "pool", req.Pool, "record", req.Record.String(), "err", err)
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return stored, nil
}

// PoolRecords has the pool's election and sync records written by a
// gateway through Client (record.Writer): a node identity may only
// read them (packaging/kubernetes/pool-rbac.yaml). A conflict comes back
// as the apiserver's (apierrors.IsConflict); other refusals as an
// *ElectionRefusedError.
type PoolRecords struct{ Client *Client }

var _ record.Writer = PoolRecords{}

// WriteRecord implements record.Writer.
func (p PoolRecords) WriteRecord(ctx context.Context, w record.Write) (*corev1.ConfigMap, error) {
	body, err := json.Marshal(w.ConfigMap)
	if err != nil {
		return nil, fmt.Errorf("record %s: %w", w.ConfigMap.Name, err)
	}
	req := tunnel.ElectionRequest{Op: tunnel.ElectionUpdate, Record: tunnel.RecordElection, Pool: w.Pool, ConfigMap: body}
	if w.Create {
		req.Op = tunnel.ElectionCreate
	}
	if w.Kind == record.KindSync {
		req.Record = tunnel.RecordSync
	}
	stored, err := p.Client.WriteElectionRecord(ctx, req)
	var re *ElectionRefusedError
	if errors.As(err, &re) && re.Code == tunnel.Conflict {
		return nil, apierrors.NewConflict(corev1.Resource("configmaps"), w.ConfigMap.Name, err)
	}
	if err != nil {
		return nil, err
	}
	var cm corev1.ConfigMap
	if err := json.Unmarshal(stored, &cm); err != nil {
		return nil, fmt.Errorf("record %s as the gateway stored it: %w", w.ConfigMap.Name, err)
	}
	return &cm, nil
}
