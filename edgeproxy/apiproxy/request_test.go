package apiproxy

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/internal/testenv"
)

// A read with a body (curl -X GET --data null) is answered by the cloud,
// which ignores the body, not refused as if the cloud were unreachable.
func TestReadWithBody(t *testing.T) {
	f := newFakeAPIServer(t)
	e := edgeFor(t, f, &switchable{})
	for _, ua := range []string{kubeletUA, "kubectl/v1.36"} {
		for _, path := range []string{"/api/v1/namespaces/ns/pods", "/api/v1/namespaces/ns/pods?watch=true&timeoutSeconds=1"} {
			get := func() (*http.Response, []byte) {
				req, _ := http.NewRequest("GET", "http://"+e.Addr+path, strings.NewReader("null"))
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				req.Header.Set("User-Agent", ua)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				return resp, body
			}
			// A trip to the fake that fails on a loaded machine makes the
			// proxy hold the watch as the cloud's silence (200, no
			// events): asked again, the cloud answers. A GET whose body
			// the proxy refused would never get the list.
			var resp *http.Response
			var body []byte
			testenv.Eventually(t, "an answer that is not a held watch", func() bool {
				resp, body = get()
				return resp.StatusCode != http.StatusOK || len(body) > 0
			})
			if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"name":"p"`) {
				t.Errorf("%s GET %s with a body: %s %s", ua, path, resp.Status, body)
			}
		}
	}
}

// Refusals say what is wrong: a status write of an object whose earlier
// writes are queued, when it cannot be kept, does not blame the cloud.
func TestRefusalSaysWhy(t *testing.T) {
	f := newFakeAPIServer(t)
	offline := &switchable{}
	e := edgeFor(t, f, offline)
	// Offline: a patch of a pod never cached is refused for want of the
	// cloud.
	offline.set(true)
	patch := func() metav1.Status {
		t.Helper()
		req, _ := http.NewRequest("PATCH", "http://"+e.Addr+"/api/v1/namespaces/ns/pods/q/status", strings.NewReader(`{"status":{}}`))
		req.Header.Set("Content-Type", "application/merge-patch+json")
		req.Header.Set("User-Agent", kubeletUA)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var st metav1.Status
		if err := json.NewDecoder(bufio.NewReader(resp.Body)).Decode(&st); err != nil || resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("patch: %s %v", resp.Status, err)
		}
		return st
	}
	if st := patch(); !strings.Contains(st.Message, "unreachable") || !strings.Contains(st.Message, "not cached") {
		t.Errorf("offline patch of an uncached pod: %q", st.Message)
	}
}
