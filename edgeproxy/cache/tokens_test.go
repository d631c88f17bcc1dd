package cache

import (
	"bytes"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func tokenKey(pod, uid string) TokenKey {
	return TokenKey{Namespace: "ns", ServiceAccount: "default", ExpirationSeconds: 3607,
		BoundAPIVersion: "v1", BoundKind: "Pod", BoundName: pod, BoundUID: uid}
}

func testToken(k TokenKey, answer string, expires, stored time.Time) *Token {
	return &Token{Key: k, ContentType: "application/json", Answer: []byte(answer), Expires: expires, BoundUID: k.BoundUID, Stored: stored}
}

// A token is found by its whole key, latest answer only; a miss names
// the pods of the same name the request was answered for; no object read
// reaches a token.
func TestTokenPutGet(t *testing.T) {
	s, clk, _ := openBounded(t, filepath.Join(t.TempDir(), FileName), Options{noCompact: true})
	now := clk.Now()
	k := tokenKey("p", "uid-1")
	must(t, s.PutToken("kubelet", testToken(k, `{"first":1}`, now.Add(time.Hour), now)))
	must(t, s.PutToken("kubelet", testToken(k, `{"second":2}`, now.Add(time.Hour), now)))
	got, _, err := s.Token("kubelet", k)
	must(t, err)
	if got == nil || string(got.Answer) != `{"second":2}` || got.BoundUID != "uid-1" || !got.Expires.Equal(now.Add(time.Hour)) {
		t.Fatalf("Token = %+v", got)
	}
	if n := s.TokenCount()["kubelet"]; n != 1 {
		t.Errorf("%d tokens stored, want 1 (the latest answer only)", n)
	}
	for name, other := range map[string]TokenKey{
		"nil audiences are empty": func() TokenKey { k := k; k.Audiences = []string{}; return k }(),
	} {
		if got, _, _ := s.Token("kubelet", other); got == nil {
			t.Errorf("%s: not found", name)
		}
	}
	for name, other := range map[string]TokenKey{
		"other uid":        tokenKey("p", "uid-2"),
		"other audience":   func() TokenKey { k := k; k.Audiences = []string{"vault"}; return k }(),
		"other expiration": func() TokenKey { k := k; k.ExpirationSeconds = 600; return k }(),
		"other request uid": func() TokenKey {
			k := k
			k.RequestUID = "sa-uid"
			return k
		}(),
	} {
		got, others, err := s.Token("kubelet", other)
		must(t, err)
		if got != nil {
			t.Errorf("%s: found %s", name, got.Answer)
		}
		if want := name == "other uid"; want != slices.Equal(others, []string{"uid-1"}) {
			t.Errorf("%s: others %v", name, others)
		}
	}
	if got, _, _ := s.Token("kube-proxy", k); got != nil {
		t.Error("another component's token found")
	}
	if st := s.Stats(); len(st) != 0 {
		t.Errorf("Stats sees tokens: %v", st)
	}
	if !s.Empty() {
		t.Error("not Empty with tokens only")
	}
}

// Tokens go at their JWT expiry (the sweep), with their pod (ForgetTokens)
// and past the bound per component (the oldest stored first).
func TestTokenGC(t *testing.T) {
	s, clk, logs := openBounded(t, filepath.Join(t.TempDir(), FileName), Options{noCompact: true})
	s.upkeep.maxTokens = 3
	now := clk.Now()
	must(t, s.PutToken("kubelet", testToken(tokenKey("short", "u-short"), "a", now.Add(20*time.Minute), now)))
	must(t, s.PutToken("kubelet", testToken(tokenKey("long", "u-long"), "b", now.Add(365*24*time.Hour), now)))
	must(t, s.PutToken("kubelet", testToken(tokenKey("gone", "u-gone"), "c", now.Add(365*24*time.Hour), now)))
	must(t, s.PutToken("coredns", testToken(tokenKey("gone", "u-gone"), "d", now.Add(365*24*time.Hour), now)))

	clk.Step(25 * time.Minute) // past the short one's expiry and the next sweep
	settle(t, s)
	if got, _, _ := s.Token("kubelet", tokenKey("short", "u-short")); got != nil {
		t.Error("an expired token survived the sweep")
	}
	if counter(t, s.upkeep.tokensDropped.WithLabelValues(tokenDroppedExpired)) != 1 {
		t.Error("expiry not counted")
	}

	s.ForgetTokens("u-gone")
	settle(t, s)
	if c := s.TokenCount(); c["kubelet"] != 1 || c["coredns"] != 0 {
		t.Errorf("after ForgetTokens: %v", c)
	}
	if counter(t, s.upkeep.tokensDropped.WithLabelValues(tokenDroppedPodDeleted)) != 2 {
		t.Error("pod deletions not counted")
	}

	for i := range 4 {
		clk.Step(time.Second)
		must(t, s.PutToken("kubelet", testToken(tokenKey(fmt.Sprint("p", i), fmt.Sprint("u", i)), "x", clk.Now().Add(time.Hour), clk.Now())))
	}
	if c := s.TokenCount()["kubelet"]; c != 3 {
		t.Errorf("%d tokens kept, want the bound, 3", c)
	}
	for _, k := range []TokenKey{tokenKey("long", "u-long"), tokenKey("p0", "u0")} {
		if got, _, _ := s.Token("kubelet", k); got != nil {
			t.Errorf("%s kept: the oldest go first", k.BoundName)
		}
	}
	if got, _, _ := s.Token("kubelet", tokenKey("p3", "u3")); got == nil {
		t.Error("the newest token dropped")
	}
	if counter(t, s.upkeep.tokensDropped.WithLabelValues(tokenDroppedCap)) != 2 {
		t.Error("drops for the bound not counted")
	}
	if !strings.Contains(logs.String(), "dropped the oldest service-account tokens") {
		t.Error("drops for the bound not logged")
	}
	if strings.Contains(logs.String(), `"x"`) || bytes.Contains([]byte(logs.String()), []byte("answer")) {
		t.Error("a token's answer in the logs")
	}
}

// Tokens survive a restart and a compaction.
func TestTokenPersists(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	s := openT(t, path)
	k := tokenKey("p", "uid-1")
	now := time.Now()
	must(t, s.PutToken("kubelet", testToken(k, "a", now.Add(time.Hour), now)))
	must(t, s.Compact())
	must(t, s.Close())
	s = openT(t, path)
	if got, _, _ := s.Token("kubelet", k); got == nil || string(got.Answer) != "a" {
		t.Errorf("after a restart: %+v", got)
	}
}
