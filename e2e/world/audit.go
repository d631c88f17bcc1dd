package world

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// auditPolicy logs every request's metadata once it is answered (and,
// for a watch, once its response has started): no bodies, and no
// RequestReceived stage, so that most requests are one event.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
`

// AuditLog is kube-apiserver's audit log of a world: what the apiserver
// itself saw, request by request, whoever sent it and whatever proxies it
// crossed. Start the world with Args in Options.APIServerArgs.
type AuditLog struct {
	// Path is the log: one JSON audit event per line.
	Path string
	// Args are the kube-apiserver flags that write it.
	Args []string
}

// NewAuditLog writes an audit policy into dir and returns the audit log
// the apiserver will write there with Args.
func NewAuditLog(dir string) (*AuditLog, error) {
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o644); err != nil {
		return nil, fmt.Errorf("audit policy: %w", err)
	}
	path := filepath.Join(dir, "audit.log")
	return &AuditLog{Path: path, Args: []string{
		"--audit-policy-file=" + policy,
		"--audit-log-path=" + path,
		"--audit-log-format=json",
		"--audit-log-mode=blocking",
	}}, nil
}

// AuditRequest is one request kube-apiserver received, from its audit
// events.
type AuditRequest struct {
	ID       string
	User     string
	Verb     string // get, list, watch, create, update, patch, delete; for a URL without a resource, the HTTP method in lower case
	Resource string // resource/subresource, or the path of a non-resource URL (/readyz)
	// Agent is the User-Agent's product (kubelet, hollow-kubelet,
	// tether-edge): the part before the first slash.
	Agent    string
	Code     int // the response's status code; 0 while a watch runs
	Received time.Time
}

// Kind is "verb resource", the key the benches count requests by.
func (r AuditRequest) Kind() string { return r.Verb + " " + r.Resource }

// auditEvent is the part of an audit.k8s.io/v1 Event the benches read.
type auditEvent struct {
	AuditID    string `json:"auditID"`
	Stage      string `json:"stage"`
	RequestURI string `json:"requestURI"`
	Verb       string `json:"verb"`
	User       struct {
		Username string `json:"username"`
	} `json:"user"`
	UserAgent string `json:"userAgent"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	RequestReceivedTimestamp time.Time `json:"requestReceivedTimestamp"`
}

// Requests reads the log and returns the requests of user (every user
// when empty) that kube-apiserver received in [from, to), each once
// (a watch logs when its response starts and again when it ends), in the
// order of the log.
func (a *AuditLog) Requests(user string, from, to time.Time) ([]AuditRequest, error) {
	f, err := os.Open(a.Path)
	if err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	defer f.Close()
	return readAudit(f, user, from, to)
}

func readAudit(f io.Reader, user string, from, to time.Time) ([]AuditRequest, error) {
	var out []AuditRequest
	seen := map[string]int{} // auditID → index in out
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if user != "" && !strings.Contains(string(line), `"username":"`+user+`"`) {
			continue // most lines: decode only the user's
		}
		var ev auditEvent
		if err := json.Unmarshal(line, &ev); err != nil {
			// The last line may be half written while the apiserver runs.
			continue
		}
		if (user != "" && ev.User.Username != user) || ev.RequestReceivedTimestamp.Before(from) || !ev.RequestReceivedTimestamp.Before(to) {
			continue
		}
		code := 0
		if ev.ResponseStatus != nil && ev.Stage == "ResponseComplete" {
			code = ev.ResponseStatus.Code
		}
		if i, ok := seen[ev.AuditID]; ok {
			if code != 0 {
				out[i].Code = code
			}
			continue
		}
		seen[ev.AuditID] = len(out)
		out = append(out, AuditRequest{
			ID:       ev.AuditID,
			User:     ev.User.Username,
			Verb:     ev.Verb,
			Resource: ev.resource(),
			Agent:    strings.SplitN(ev.UserAgent, "/", 2)[0],
			Code:     code,
			Received: ev.RequestReceivedTimestamp,
		})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	return out, nil
}

func (ev auditEvent) resource() string {
	if ev.ObjectRef == nil || ev.ObjectRef.Resource == "" {
		path, _, _ := strings.Cut(ev.RequestURI, "?")
		return path
	}
	if ev.ObjectRef.Subresource != "" {
		return ev.ObjectRef.Resource + "/" + ev.ObjectRef.Subresource
	}
	return ev.ObjectRef.Resource
}

// NodeUser is the user kube-apiserver knows node's requests by: its
// certificate's (the kubelet's, and tether-edge's, which speaks for the
// node with it).
func NodeUser(node string) string { return "system:node:" + node }
