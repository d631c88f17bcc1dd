package cache

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Service-account tokens the cloud issued to node components (the
// answers to their TokenRequests), kept so that the proxy can answer the
// same request again while the cloud is away: the kubelet keeps its
// tokens in memory only, and a kubelet restarted offline must mount its
// pods' projected token volumes again. They live in their own top-level
// bucket, which no object read (Get, List, Scan, Info, Stats) reaches:
//
//	tokens/<component>/<namespace>/<service account>/<key hash> -> JSON Token
//
// Only the latest answer per key is kept. Entries go when their token
// expires (the JWT's exp, checked with the tombstone sweep), when the pod
// they are bound to is deleted (ForgetTokens), and past MaxTokensPerComponent
// (the oldest stored first).
var bucketTokens = []byte("tokens")

const (
	// MaxTokensPerComponent bounds the tokens kept per component: a node
	// runs at most a few hundred pods, each with a token or two.
	MaxTokensPerComponent = 2048
	// tokenSweepEvery spaces the sweeps of expired tokens.
	tokenSweepEvery = 15 * time.Minute
)

// TokenKey identifies a TokenRequest as the kubelet's token manager keys
// its cache (keyFunc): namespace, service account, the audiences and
// expirationSeconds as sent (nil is empty, and 0), the whole bound object
// reference and the request's metadata.uid. The component is kept apart.
type TokenKey struct {
	Namespace         string   `json:"namespace"`
	ServiceAccount    string   `json:"serviceAccount"`
	Audiences         []string `json:"audiences"`
	ExpirationSeconds int64    `json:"expirationSeconds"`
	BoundAPIVersion   string   `json:"boundAPIVersion"`
	BoundKind         string   `json:"boundKind"`
	BoundName         string   `json:"boundName"`
	BoundUID          string   `json:"boundUID"`
	RequestUID        string   `json:"requestUID"`
}

// hash names the key in its bucket.
func (k TokenKey) hash() string {
	if k.Audiences == nil {
		k.Audiences = []string{}
	}
	b, _ := json.Marshal(k)
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

func (k TokenKey) equal(o TokenKey) bool {
	return k.Namespace == o.Namespace && k.ServiceAccount == o.ServiceAccount && slices.Equal(k.Audiences, o.Audiences) &&
		k.ExpirationSeconds == o.ExpirationSeconds && k.BoundAPIVersion == o.BoundAPIVersion && k.BoundKind == o.BoundKind &&
		k.BoundName == o.BoundName && k.BoundUID == o.BoundUID && k.RequestUID == o.RequestUID
}

// sibling reports whether o is the same request for another bound UID.
func (k TokenKey) sibling(o TokenKey) bool {
	o.BoundUID = k.BoundUID
	return k.equal(o)
}

// Token is the cloud's answer to a TokenRequest, as the proxy relayed it.
type Token struct {
	Key TokenKey `json:"key"`
	// ContentType and Answer are the answer's, byte for byte.
	ContentType string `json:"contentType"`
	Answer      []byte `json:"answer"`
	// Expires is the JWT's exp claim (or the answer's
	// status.expirationTimestamp if the token does not read as a JWT).
	Expires time.Time `json:"expires"`
	// BoundUID is the UID of the pod the token is bound to.
	BoundUID string `json:"boundUID"`
	// Stored is when the answer was stored.
	Stored time.Time `json:"stored"`
}

func tokenPath(k TokenKey) []byte {
	return []byte(k.Namespace + "/" + k.ServiceAccount + "/" + k.hash())
}

// PutToken stores t, in place of the answer stored for the same key, and
// returns once it is committed. Past MaxTokensPerComponent the oldest
// stored tokens of the component go (logged at warn and counted).
func (s *Store) PutToken(component string, t *Token) error {
	v, err := json.Marshal(t)
	if err != nil {
		return err
	}
	return s.write(func(tx *bolt.Tx) error {
		tb, err := tx.CreateBucketIfNotExists(bucketTokens)
		if err != nil {
			return err
		}
		cb, err := tb.CreateBucketIfNotExists([]byte(component))
		if err != nil {
			return err
		}
		s.dirty = true
		if err := cb.Put(tokenPath(t.Key), v); err != nil {
			return err
		}
		n, err := dropOldestTokens(cb, s.upkeep.maxTokens)
		if n > 0 {
			s.upkeep.tokensDropped.WithLabelValues(tokenDroppedCap).Add(float64(n))
			s.log.Warn("cache: dropped the oldest service-account tokens stored for a component: it holds more than the bound",
				"component", component, "dropped", n, "max", s.upkeep.maxTokens)
		}
		return err
	})
}

// dropOldestTokens deletes the oldest stored entries of cb beyond max.
func dropOldestTokens(cb *bolt.Bucket, max int) (int, error) {
	n, c := 0, cb.Cursor()
	for k, _ := c.First(); k != nil && n <= max; k, _ = c.Next() {
		n++
	}
	if n <= max {
		return 0, nil
	}
	type entry struct {
		k      []byte
		stored time.Time
	}
	var all []entry
	cb.ForEach(func(k, v []byte) error {
		var t Token
		json.Unmarshal(v, &t) // one that does not read is the oldest
		all = append(all, entry{bytes.Clone(k), t.Stored})
		return nil
	})
	if len(all) <= max {
		return 0, nil
	}
	slices.SortFunc(all, func(a, b entry) int { return a.stored.Compare(b.stored) })
	n = len(all) - max
	for _, e := range all[:n] {
		if err := cb.Delete(e.k); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// Token returns the token stored for component and k, or nil. With none,
// it returns the bound UIDs of the tokens stored for the same request
// bound to other pods (with the same name), for the proxy to say why.
func (s *Store) Token(component string, k TokenKey) (t *Token, others []string, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		tb := tx.Bucket(bucketTokens)
		if tb == nil {
			return nil
		}
		cb := tb.Bucket([]byte(component))
		if cb == nil {
			return nil
		}
		if v := cb.Get(tokenPath(k)); v != nil {
			var got Token
			if err := json.Unmarshal(v, &got); err != nil {
				return fmt.Errorf("stored token: %w", err)
			}
			if got.Key.equal(k) {
				t = &got // json.Unmarshal copied the bytes
				return nil
			}
		}
		prefix := []byte(k.Namespace + "/" + k.ServiceAccount + "/")
		c := cb.Cursor()
		for kk, v := c.Seek(prefix); kk != nil && bytes.HasPrefix(kk, prefix); kk, v = c.Next() {
			var o Token
			if json.Unmarshal(v, &o) == nil && o.Key.BoundUID != k.BoundUID && k.sibling(o.Key) {
				others = append(others, o.BoundUID)
			}
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("read cache: %w", err)
	}
	return t, others, nil
}

// ForgetTokens drops, without waiting, the tokens bound to the pod of
// that UID (of every component): the pod was deleted.
func (s *Store) ForgetTokens(uid string) {
	if uid == "" {
		return
	}
	s.submit(op{apply: func(tx *bolt.Tx) error {
		n, err := s.dropTokens(tx, []byte(uid), func(t *Token) bool { return t.BoundUID == uid })
		if n > 0 {
			s.upkeep.tokensDropped.WithLabelValues(tokenDroppedPodDeleted).Add(float64(n))
		}
		return err
	}})
}

// dropTokens deletes the tokens for which drop is true (and those that
// do not read), and returns how many it deleted. With a hint, only
// entries whose bytes hold it are read.
func (s *Store) dropTokens(tx *bolt.Tx, hint []byte, drop func(t *Token) bool) (int, error) {
	tb := tx.Bucket(bucketTokens)
	if tb == nil {
		return 0, nil
	}
	n := 0
	err := tb.ForEachBucket(func(comp []byte) error {
		cb := tb.Bucket(comp)
		var gone [][]byte
		cb.ForEach(func(k, v []byte) error {
			var t Token
			if v == nil || (hint != nil && !bytes.Contains(v, hint)) {
				return nil
			}
			if json.Unmarshal(v, &t) != nil || drop(&t) {
				gone = append(gone, bytes.Clone(k))
			}
			return nil
		})
		for _, k := range gone {
			if err := cb.Delete(k); err != nil {
				return err
			}
		}
		n += len(gone)
		return nil
	})
	if n > 0 {
		s.dirty = true
	}
	return n, err
}

// expireTokens drops the tokens whose JWT has expired (writer only).
func (s *Store) expireTokens(now time.Time) {
	var n int
	err := s.db.Update(func(tx *bolt.Tx) error {
		var err error
		if n, err = s.dropTokens(tx, nil, func(t *Token) bool { return !now.Before(t.Expires) }); err != nil {
			return err
		}
		if n == 0 {
			return errUnchanged
		}
		return nil
	})
	if err != nil {
		if err != errUnchanged {
			s.log.Warn("cache: expiring service-account tokens failed", "err", err)
		}
		return
	}
	s.upkeep.tokensDropped.WithLabelValues(tokenDroppedExpired).Add(float64(n))
	s.log.Debug("cache: dropped expired service-account tokens", "count", n)
}

// TokenCount is the number of tokens stored, per component.
func (s *Store) TokenCount() map[string]int {
	out := map[string]int{}
	s.db.View(func(tx *bolt.Tx) error {
		tb := tx.Bucket(bucketTokens)
		if tb == nil {
			return nil
		}
		return tb.ForEachBucket(func(comp []byte) error {
			n := 0
			tb.Bucket(comp).ForEach(func(_, _ []byte) error { n++; return nil })
			out[string(comp)] = n
			return nil
		})
	})
	return out
}

// Why tokens were dropped, the "reason" label of tokens_dropped_total.
const (
	tokenDroppedExpired    = "expired"
	tokenDroppedPodDeleted = "pod_deleted"
	tokenDroppedCap        = "bound"
)

// Tokens returns every token stored, of every component (the pod
// listener's ledger of identities is built from them at start).
func (s *Store) Tokens() ([]Token, error) {
	var out []Token
	err := s.db.View(func(tx *bolt.Tx) error {
		tb := tx.Bucket(bucketTokens)
		if tb == nil {
			return nil
		}
		return tb.ForEachBucket(func(comp []byte) error {
			return tb.Bucket(comp).ForEach(func(_, v []byte) error {
				var t Token
				if json.Unmarshal(v, &t) == nil { // copies the bytes
					out = append(out, t)
				}
				return nil
			})
		})
	})
	if err != nil {
		return nil, fmt.Errorf("read cache: %w", err)
	}
	return out, nil
}
