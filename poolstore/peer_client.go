package poolstore

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// requestTimeout bounds a peer request other than a stream.
const requestTimeout = 10 * time.Second

// ErrNotLeader matches (errors.Is) a PeerError whose peer does not lead
// the pool.
var ErrNotLeader = errors.New("poolstore: peer is not the pool leader")

// PeerError is a peer's refusal of a request.
type PeerError struct {
	Node       string
	StatusCode int
	// Reason is Forbidden, NotLeader, BadRequest or Unavailable.
	Reason  string
	Message string
	// Leader is, with NotLeader, the leader the peer knows ("" if none).
	Leader string
}

func (e *PeerError) Error() string {
	reason := e.Reason
	if reason == "" {
		reason = http.StatusText(e.StatusCode)
	}
	return fmt.Sprintf("%d %s: %s", e.StatusCode, reason, e.Message)
}

func (e *PeerError) Is(target error) bool {
	return target == ErrNotLeader && e.Reason == reasonNotLeader
}

// Client makes requests to pool peers over HTTP/2 with mTLS. Requests
// are addressed by node name (the URL's host is the node's name): the
// connection goes to the node's address from Members, and the peer's
// certificate must name that node. One connection per peer carries all
// requests to it. Its methods are safe for concurrent use.
type Client struct {
	cfg PeerConfig
	tr  *http.Transport
	hc  *http.Client
}

// NewClient returns a Client for cfg.
func NewClient(cfg PeerConfig) (*Client, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	var protos http.Protocols
	protos.SetHTTP2(true)
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		// addr is "<node>:<port>" from the URL.
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			node, _, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			a, err := cfg.addr(node)
			if err != nil {
				return nil, err
			}
			return dialer.DialContext(ctx, network, a)
		},
		TLSClientConfig:       cfg.clientTLS(),
		Protocols:             &protos,
		HTTP2:                 &http.HTTP2Config{SendPingTimeout: 15 * time.Second, PingTimeout: 10 * time.Second},
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 15 * time.Second,
		IdleConnTimeout:       90 * time.Second,
	}
	return &Client{cfg: cfg, tr: tr, hc: &http.Client{Transport: tr}}, nil
}

// Close closes the idle connections; a Client stays usable.
func (c *Client) Close() { c.tr.CloseIdleConnections() }

func (c *Client) url(node, path string, q url.Values) string {
	u := url.URL{Scheme: "https", Host: net.JoinHostPort(node, strconv.Itoa(c.cfg.Port)), Path: path, RawQuery: q.Encode()}
	return u.String()
}

// AskLeader asks node whom it knows as the pool's leader (a follower that
// cannot reach the cloud asks its peers).
func (c *Client) AskLeader(ctx context.Context, node string) (LeaderInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	var info LeaderInfo
	resp, err := c.do(ctx, node, http.MethodGet, pathLeader, nil, nil)
	if err != nil {
		return info, fmt.Errorf("ask %s for the pool leader: %w", node, err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&info); err != nil {
		return info, fmt.Errorf("ask %s for the pool leader: decode answer: %w", node, err)
	}
	return info, nil
}

// SendHeartbeat sends this node's own node Lease (its JSON) to node, the
// leader, to have it written to the cloud on this node's behalf. A
// refusal is a *PeerError (ErrNotLeader if node does not lead).
func (c *Client) SendHeartbeat(ctx context.Context, node string, lease []byte) error {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, err := c.do(ctx, node, http.MethodPost, pathHeartbeat, nil, lease)
	if err != nil {
		return fmt.Errorf("delegate heartbeat to %s: %w", node, err)
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // let the connection be reused
	resp.Body.Close()
	return nil
}

// replicate opens the replication stream from node, the leader, for a
// replica at (epoch, rev); the caller reads and closes the body.
func (c *Client) replicate(ctx context.Context, node, epoch string, rev uint64) (*http.Response, error) {
	q := url.Values{"epoch": {epoch}, "rev": {strconv.FormatUint(rev, 10)}}
	resp, err := c.do(ctx, node, http.MethodGet, pathReplicate, q, nil)
	if err != nil {
		return nil, fmt.Errorf("replicate from %s: %w", node, err)
	}
	return resp, nil
}

// do makes a request to node and returns the response if it is 200,
// else a *PeerError.
func (c *Client) do(ctx context.Context, node, method, path string, q url.Values, body []byte) (*http.Response, error) {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.url(node, path, q), r)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode == http.StatusOK {
		return resp, nil
	}
	defer resp.Body.Close()
	var st apiStatus
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if json.Unmarshal(data, &st) != nil {
		st.Message = string(data)
	}
	return nil, &PeerError{Node: node, StatusCode: resp.StatusCode, Reason: st.Reason, Message: st.Message, Leader: st.Leader}
}
