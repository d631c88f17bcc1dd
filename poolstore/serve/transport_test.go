package serve

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

func roundTrip(t *testing.T, h http.Handler, req *http.Request) (*http.Response, error) {
	t.Helper()
	return (&http.Client{Transport: Transport(h)}).Do(req)
}

func newRequest(t *testing.T, ctx context.Context, method, body string) *http.Request {
	t.Helper()
	var b io.Reader
	if body != "" {
		b = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://pool/api/v1/services?watch=1", b)
	mustNil(t, err)
	return req
}

func within(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not within 10 s", what)
	}
}

// TestTransportStreams: the response comes back once the header is
// written, each flush reaches the client at once, and closing the body
// ends the handler's request context.
func TestTransportStreams(t *testing.T) {
	next := make(chan string)
	handlerDone := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(handlerDone)
		if r.RequestURI != "/api/v1/services?watch=1" || r.URL.Query().Get("watch") != "1" || r.Host != "pool" {
			http.Error(w, "request as a server has it: "+r.RequestURI+" "+r.Host, 500)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		for {
			select {
			case line := <-next:
				io.WriteString(w, line+"\n")
				w.(http.Flusher).Flush()
			case <-r.Context().Done():
				return
			}
		}
	})
	resp, err := roundTrip(t, h, newRequest(t, context.Background(), http.MethodGet, ""))
	mustNil(t, err)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" || resp.ContentLength != -1 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("%s %v %s", resp.Status, resp.Header, b)
	}
	br := bufio.NewReader(resp.Body)
	for _, want := range []string{"one", "two"} {
		next <- want
		line, err := br.ReadString('\n')
		if err != nil || line != want+"\n" {
			t.Fatalf("read %q, %v; want %q", line, err, want)
		}
	}
	resp.Body.Close()
	within(t, "handler ends after Close", handlerDone)
}

// TestTransportRequestContext: a request whose context ends before the
// handler answers fails, and the handler's context ends with it.
func TestTransportRequestContext(t *testing.T) {
	handlerDone := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(handlerDone)
		<-r.Context().Done()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := roundTrip(t, h, newRequest(t, ctx, http.MethodGet, "")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err %v, want the deadline", err)
	}
	within(t, "handler ends with the request", handlerDone)
}

func TestTransportAnswers(t *testing.T) {
	for _, tc := range []struct {
		name, method, body string
		h                  http.HandlerFunc
		code               int
		length             int64
		want               string
		wantErr            string
	}{
		{name: "body and length", method: "POST", body: "ping",
			h: func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				w.Header().Set("Content-Length", "5")
				w.WriteHeader(http.StatusCreated)
				w.Write(append(b, '!'))
			},
			code: 201, length: 5, want: "ping!"},
		{name: "implicit 200", method: "GET",
			h:    func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") },
			code: 200, length: -1, want: "ok"},
		{name: "nothing written", method: "GET",
			h:    func(w http.ResponseWriter, r *http.Request) {},
			code: 200, length: -1, want: ""},
		{name: "HEAD", method: "HEAD",
			h:    func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "dropped") },
			code: 200, length: 0, want: ""},
		{name: "panic before the header", method: "GET",
			h:       func(w http.ResponseWriter, r *http.Request) { panic("boom") },
			wantErr: "handler panic: boom"},
		{name: "panic in the body", method: "GET",
			h: func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, "partial")
				w.(http.Flusher).Flush()
				panic("boom")
			},
			code: 200, length: -1, want: "partial", wantErr: "handler panic: boom"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := roundTrip(t, tc.h, newRequest(t, context.Background(), tc.method, tc.body))
			if tc.code == 0 {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			mustNil(t, err)
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("body error %v, want %q", err, tc.wantErr)
			}
			if tc.wantErr == "" && err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.code || resp.ContentLength != tc.length || string(b) != tc.want {
				t.Fatalf("%d length %d %q; want %d length %d %q", resp.StatusCode, resp.ContentLength, b, tc.code, tc.length, tc.want)
			}
		})
	}
}
