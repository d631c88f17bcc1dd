package serve

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
)

// Transport returns an http.RoundTripper that serves requests with
// h in this process, as if h were behind an HTTP server: the response
// returns once h has written its header, its body streams through a pipe
// while h writes it (so watches stream), and the request's context, or
// closing the body, ends h's request context. What a server adds (content
// sniffing, Date, gzip) is not added; a panic of h becomes the
// request's error, or the body's.
func Transport(h http.Handler) http.RoundTripper {
	return handlerTransport{h}
}

type handlerTransport struct{ h http.Handler }

// pipeBuffer is the body bytes gathered before they go through the pipe
// (flushing sends them at once).
const pipeBuffer = 32 << 10

func (t handlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancel(req.Context())
	pr, pw := io.Pipe()
	rw := &pipeResponse{header: http.Header{}, pw: pw, ready: make(chan struct{}),
		discard: req.Method == http.MethodHead}
	rw.bw = bufio.NewWriterSize(pw, pipeBuffer)
	go func() {
		defer cancel()
		err := serveRecovered(t.h, rw, serverRequest(ctx, req))
		if req.Body != nil {
			req.Body.Close()
		}
		rw.finish(err)
	}()
	select {
	case <-rw.ready:
	case <-req.Context().Done():
		pr.CloseWithError(req.Context().Err())
		return nil, fmt.Errorf("in-process %s %s: %w", req.Method, req.URL.Path, req.Context().Err())
	}
	if rw.err != nil {
		pr.Close()
		return nil, fmt.Errorf("in-process %s %s: %w", req.Method, req.URL.Path, rw.err)
	}
	resp := &http.Response{
		Status:        fmt.Sprintf("%d %s", rw.code, http.StatusText(rw.code)),
		StatusCode:    rw.code,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        rw.sent,
		ContentLength: -1,
		Body:          &pipeBody{pr: pr, cancel: cancel},
		Request:       req,
	}
	if n, err := strconv.ParseInt(rw.sent.Get("Content-Length"), 10, 64); err == nil && n >= 0 {
		resp.ContentLength = n
	}
	if !bodyAllowed(req.Method, rw.code) {
		resp.ContentLength = 0
		resp.Body = http.NoBody
		pr.Close()
	}
	return resp, nil
}

// serverRequest is req as a server hands it to a handler.
func serverRequest(ctx context.Context, req *http.Request) *http.Request {
	r := req.Clone(ctx)
	r.RequestURI = req.URL.RequestURI()
	if r.Host == "" {
		r.Host = req.URL.Host
	}
	if r.Body == nil {
		r.Body = http.NoBody
	}
	return r
}

// serveRecovered runs h, turning a panic into an error.
func serveRecovered(h http.Handler, w http.ResponseWriter, r *http.Request) (err error) {
	defer func() {
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				err = errors.New("handler aborted")
				return
			}
			err = fmt.Errorf("handler panic: %v", p)
		}
	}()
	h.ServeHTTP(w, r)
	return nil
}

func bodyAllowed(method string, code int) bool {
	return method != http.MethodHead && code != http.StatusNoContent && code != http.StatusNotModified
}

// pipeResponse is the http.ResponseWriter of an in-process request. Only
// the handler's goroutine uses it, but for ready and the fields it
// publishes before closing ready (code, sent, err).
type pipeResponse struct {
	header  http.Header
	pw      *io.PipeWriter
	bw      *bufio.Writer
	discard bool // HEAD: the body is dropped

	once  sync.Once
	ready chan struct{} // closed once code and sent, or err, are set
	code  int
	sent  http.Header
	err   error
}

var _ http.Flusher = (*pipeResponse)(nil)

func (w *pipeResponse) Header() http.Header { return w.header }

func (w *pipeResponse) WriteHeader(code int) {
	if code < 200 && code != http.StatusSwitchingProtocols {
		return // informational: not the response
	}
	w.once.Do(func() {
		w.code, w.sent = code, w.header.Clone()
		close(w.ready)
	})
}

func (w *pipeResponse) Write(p []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	if w.discard || !bodyAllowed("", w.code) {
		return len(p), nil
	}
	return w.bw.Write(p)
}

// FlushError sends what was written to the client; http.ResponseController
// uses it.
func (w *pipeResponse) FlushError() error {
	w.WriteHeader(http.StatusOK)
	return w.bw.Flush()
}

func (w *pipeResponse) Flush() { w.FlushError() }

// finish ends the response once the handler has returned.
func (w *pipeResponse) finish(err error) {
	w.once.Do(func() {
		if err == nil {
			w.code, w.sent = http.StatusOK, w.header.Clone()
		}
		w.err = err
		close(w.ready)
	})
	if err == nil {
		err = w.bw.Flush()
	}
	w.pw.CloseWithError(err) // nil: EOF
}

// pipeBody is the body of an in-process response: closing it ends the
// handler's request context.
type pipeBody struct {
	pr     *io.PipeReader
	cancel context.CancelFunc
}

func (b *pipeBody) Read(p []byte) (int, error) { return b.pr.Read(p) }

func (b *pipeBody) Close() error {
	b.cancel()
	return b.pr.CloseWithError(errBodyClosed)
}

var errBodyClosed = errors.New("poolstore: in-process response body closed")
