package apiproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
)

// Internal describes one of tether-edge's own clients of the proxy (the
// topology filter's informers, the node pool's client and Node informer).
// They reach the proxy in process, through a Loopback, and are known by
// the request's context, never by their User-Agent: a local client that
// sends the same User-Agent is one more component.
type Internal struct {
	// Name is the client's component name, in metrics and logs.
	Name string
	// Cached: its get, list and watch answers are cached and served
	// offline, as a cached component's.
	Cached bool
	// NotFromPool: its reads are never answered from the node pool's
	// replica (the pool's own requests).
	NotFromPool bool
}

type internalKey struct{}

// internalOf is the internal client that made r, nil for a client of the
// listener.
func internalOf(r *http.Request) *Internal {
	in, _ := r.Context().Value(internalKey{}).(*Internal)
	return in
}

// Loopback is an http.RoundTripper that serves client-go's requests
// through a Proxy's handler without a socket: the handler runs on its own
// goroutine and streams its answer through a pipe, so that watches work;
// closing the response body ends the request's context. It may be made
// before the Proxy (the filter is an option of New and reads through the
// proxy): requests fail until Bind.
type Loopback struct {
	c Internal
	p atomic.Pointer[Proxy]
}

var _ http.RoundTripper = (*Loopback)(nil)

// NewLoopback returns the in-process transport of the internal client c.
func NewLoopback(c Internal) *Loopback { return &Loopback{c: c} }

// Bind has l's requests served by p.
func (l *Loopback) Bind(p *Proxy) { l.p.Store(p) }

// RoundTrip serves req through the proxy's handler.
func (l *Loopback) RoundTrip(req *http.Request) (*http.Response, error) {
	p := l.p.Load()
	if p == nil {
		return nil, fmt.Errorf("apiproxy: %s: the proxy is not running yet", l.c.Name)
	}
	ctx, cancel := context.WithCancel(context.WithValue(req.Context(), internalKey{}, &l.c))
	in := req.Clone(ctx)
	in.URL = &url.URL{Path: req.URL.Path, RawPath: req.URL.RawPath, RawQuery: req.URL.RawQuery}
	in.RequestURI = in.URL.RequestURI()
	in.Proto, in.ProtoMajor, in.ProtoMinor = "HTTP/1.1", 1, 1
	in.RemoteAddr = "in-process"
	if in.Host == "" {
		in.Host = req.URL.Host
	}
	if in.Body == nil {
		in.Body = http.NoBody
	}
	pr, pw := io.Pipe()
	w := &pipeResponse{header: http.Header{}, body: pw, wrote: make(chan struct{})}
	go func() {
		defer func() {
			if v := recover(); v != nil {
				err := fmt.Errorf("apiproxy: %s %s: %v", req.Method, req.URL.Path, v)
				if errors.Is(asError(v), http.ErrAbortHandler) {
					err = fmt.Errorf("apiproxy: %s %s: answer aborted", req.Method, req.URL.Path)
				}
				w.fail(err)
				pw.CloseWithError(err)
				return
			}
			w.WriteHeader(http.StatusOK) // if the handler wrote nothing
			pw.Close()
		}()
		p.ServeHTTP(w, in)
	}()
	select {
	case <-w.wrote:
	case <-ctx.Done():
		cancel()
		pr.CloseWithError(ctx.Err())
		return nil, ctx.Err()
	}
	if w.err != nil {
		cancel()
		return nil, w.err
	}
	resp := &http.Response{
		Status:     strconv.Itoa(w.code) + " " + http.StatusText(w.code),
		StatusCode: w.code, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: w.sent, Body: &loopbackBody{PipeReader: pr, cancel: cancel}, ContentLength: -1, Request: req,
	}
	if n, err := strconv.ParseInt(w.sent.Get("Content-Length"), 10, 64); err == nil {
		resp.ContentLength = n
	}
	return resp, nil
}

func asError(v any) error {
	err, _ := v.(error)
	return err
}

// pipeResponse is the handler's http.ResponseWriter: the header is handed
// over at WriteHeader, the body goes through the pipe as written.
type pipeResponse struct {
	header http.Header
	body   *io.PipeWriter
	once   sync.Once
	wrote  chan struct{} // closed at WriteHeader or failure
	code   int
	sent   http.Header
	err    error
}

func (w *pipeResponse) Header() http.Header { return w.header }

func (w *pipeResponse) WriteHeader(code int) {
	w.once.Do(func() {
		w.code, w.sent = code, w.header.Clone()
		close(w.wrote)
	})
}

func (w *pipeResponse) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.body.Write(b)
}

// Flush: written bytes are already in the reader's hands.
func (w *pipeResponse) Flush() {}

func (w *pipeResponse) fail(err error) {
	w.once.Do(func() {
		w.err = err
		close(w.wrote)
	})
}

// loopbackBody ends the request's context when the client closes it.
type loopbackBody struct {
	*io.PipeReader
	cancel context.CancelFunc
}

func (b *loopbackBody) Close() error {
	b.cancel()
	return b.PipeReader.Close()
}
