package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-edge/tether/internal/openyurt"
	"github.com/tether-edge/tether/internal/version"
	"github.com/tether-edge/tether/poolstore/record"
)

// cloudPool is one node pool as the cloud apiserver holds it; the JSON
// output of `tetherctl pools` is a list of them, sorted by pool.
type cloudPool struct {
	Pool string `json:"pool"`
	// Election is the record tether-system/pool-<pool> (nil: none, or
	// released by a leader that shut down).
	Election *poolRecord `json:"election"`
	// Sync is the leader-informer-sync record tether-system/pool-<pool>-sync
	// (nil: none yet).
	Sync *poolRecord `json:"sync"`
	// Members are the Nodes with the pool's label; Delegated those whose
	// node Lease carries openyurt.io/delegate-heartbeat: "true", Tainted
	// those with the taint node.openyurt.io/unschedulable. Sorted.
	Members   []string `json:"members"`
	Delegated []string `json:"delegated"`
	Tainted   []string `json:"tainted"`
}

// poolRecord is an election or sync record: who holds it, when it was
// last renewed, and whether that was longer ago than its duration when
// tetherctl read it. An election record's duration counts at most the
// pools' configured lease (--pool-lease-duration), as the edges and the
// gateways count it; LeaseSeconds is set when the record was written with
// a longer one (by a tool or an edge of another configuration, or a node
// trying to hold the lead beyond it).
type poolRecord struct {
	Holder       string    `json:"holder"`
	Renewed      time.Time `json:"renewed"`
	Expires      time.Time `json:"expires,omitzero"`
	Expired      bool      `json:"expired"`
	LeaseSeconds int       `json:"leaseSecondsOverBound,omitempty"`
}

// poolsRBAC says what `tetherctl pools` reads, for Forbidden errors.
const poolsRBAC = "tetherctl pools needs list on nodes, list on leases in kube-node-lease and get on configmaps in " +
	record.Namespace + ": an admin kubeconfig has them, and so has the gateway's identity (packaging/kubernetes/gateway-rbac.yaml)"

// pools prints the node pools: with --edge the pool part of the edges'
// /status, otherwise what the cloud apiserver holds.
func pools(ctx context.Context, o options, stdout, stderr io.Writer) int {
	if len(o.edges) > 0 {
		return edgePools(ctx, o, stdout, stderr)
	}
	client, err := kubeClient(o)
	if err != nil {
		fmt.Fprintln(stderr, o.prog+" pools:", err)
		return exitError
	}
	now := time.Now()
	ps, err := readPools(ctx, client, now, o.poolLease)
	if err != nil {
		fmt.Fprintln(stderr, o.prog+" pools:", err)
		return exitError
	}
	if o.output == "json" {
		return writeJSON(stdout, stderr, ps)
	}
	writePoolsTable(stdout, ps, now, o.output == "wide")
	return exitOK
}

// kubeClient builds a client from --kubeconfig, else client-go's loading
// rules ($KUBECONFIG, then ~/.kube/config; in a pod, its service account),
// with --context's context instead of the current one if given.
func kubeClient(o options) (kubernetes.Interface, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = o.kubeconfig
	overrides := &clientcmd.ConfigOverrides{CurrentContext: o.kubeContext}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides).ClientConfig()
	if clientcmd.IsEmptyConfig(err) {
		return nil, fmt.Errorf("no kubeconfig found (looked for %s): give --kubeconfig, set $KUBECONFIG, "+
			"or read the edges' /status with --edge", strings.Join(rules.GetLoadingPrecedence(), ", "))
	}
	if err != nil {
		if o.kubeconfig != "" {
			return nil, fmt.Errorf("kubeconfig %s: %w", o.kubeconfig, err)
		}
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.UserAgent = "tetherctl/" + version.Version
	cfg.Timeout = o.timeout
	cfg.QPS, cfg.Burst = 50, 100
	return kubernetes.NewForConfig(cfg)
}

// readPools reads every pool: the distinct values of the pool label on
// Nodes, each pool's election and sync records (read by name: the
// gateway's RBAC gets them but does not list ConfigMaps), and the node
// Leases and taints of its members; maxLease bounds the election
// records' leases.
func readPools(ctx context.Context, client kubernetes.Interface, now time.Time, maxLease time.Duration) ([]cloudPool, error) {
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: openyurt.PoolLabel})
	if err != nil {
		return nil, kubeError("list nodes", err)
	}
	leases, err := client.CoordinationV1().Leases(corev1.NamespaceNodeLease).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, kubeError("list leases in "+corev1.NamespaceNodeLease, err)
	}
	delegated := map[string]bool{}
	for _, l := range leases.Items {
		if l.Annotations[openyurt.DelegateHeartbeatAnnotation] == "true" {
			delegated[l.Name] = true
		}
	}

	byName := map[string]*cloudPool{}
	for _, n := range nodes.Items {
		name := n.Labels[openyurt.PoolLabel]
		if name == "" {
			continue // in no pool, as tether-edge takes it
		}
		p := byName[name]
		if p == nil {
			p = &cloudPool{Pool: name, Members: []string{}, Delegated: []string{}, Tainted: []string{}}
			byName[name] = p
		}
		p.Members = append(p.Members, n.Name)
		if delegated[n.Name] {
			p.Delegated = append(p.Delegated, n.Name)
		}
		if slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == openyurt.UnschedulableTaintKey }) {
			p.Tainted = append(p.Tainted, n.Name)
		}
	}
	ps := make([]cloudPool, 0, len(byName))
	for _, p := range byName {
		slices.Sort(p.Members)
		slices.Sort(p.Delegated)
		slices.Sort(p.Tainted)
		ps = append(ps, *p)
	}
	slices.SortFunc(ps, func(a, b cloudPool) int { return cmp.Compare(a.Pool, b.Pool) })

	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(8)
	for i := range ps {
		p := &ps[i]
		g.Go(func() error {
			el, err := record.ReadLeader(gctx, client.CoreV1().ConfigMaps(record.Namespace), p.Pool)
			switch {
			case apierrors.IsNotFound(err):
			case err != nil:
				return kubeError("get election record "+record.Namespace+"/"+record.ElectionName(p.Pool), err)
			default:
				exp := el.Expires(maxLease)
				p.Election = &poolRecord{Holder: el.Holder, Renewed: el.Renewed, Expires: exp, Expired: now.After(exp)}
				if int64(el.LeaseSeconds) > int64(maxLease/time.Second) {
					p.Election.LeaseSeconds = el.LeaseSeconds
				}
			}
			p.Sync, err = readSyncRecord(gctx, client, p.Pool, now)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return ps, nil
}

// readSyncRecord reads pool's leader-informer-sync record (nil when there
// is none, or it is not in the format poolstore writes).
func readSyncRecord(ctx context.Context, client kubernetes.Interface, pool string, now time.Time) (*poolRecord, error) {
	name := record.SyncName(pool)
	cm, err := client.CoreV1().ConfigMaps(record.Namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	} else if err != nil {
		return nil, kubeError("get sync record "+record.Namespace+"/"+name, err)
	}
	renewed, err := time.Parse(time.RFC3339Nano, cm.Data["renewTime"])
	if err != nil || cm.Data["holderIdentity"] == "" {
		return nil, nil
	}
	rec := &poolRecord{Holder: cm.Data["holderIdentity"], Renewed: renewed}
	if secs, err := strconv.Atoi(cm.Data["leaseDurationSeconds"]); err == nil && secs > 0 {
		rec.Expires = renewed.Add(time.Duration(secs) * time.Second)
		rec.Expired = now.After(rec.Expires)
	}
	return rec, nil
}

// kubeError says what was being read and, when the apiserver refused it,
// what tetherctl needs.
func kubeError(what string, err error) error {
	switch {
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%s: %w; %s", what, err, poolsRBAC)
	case apierrors.IsUnauthorized(err):
		return fmt.Errorf("%s: %w (the apiserver did not accept the kubeconfig's credentials)", what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// writePoolsTable prints a line per pool; wide adds the members' names.
func writePoolsTable(w io.Writer, ps []cloudPool, now time.Time, wide bool) {
	if len(ps) == 0 {
		fmt.Fprintf(w, "no node pools: no Node has the label %s\n", openyurt.PoolLabel)
		return
	}
	tw := newTable(w, wide, "POOL\tMEMBERS\tLEADER\tRENEWED\tLAST SYNC\tDELEGATED\tTAINTED", "NODES")
	for _, p := range ps {
		leader, renewed := "none", "-"
		if e := p.Election; e != nil {
			leader, renewed = e.Holder, formatAge(e.Renewed, now)
			if e.Expired {
				leader += " (expired)"
			}
			if e.LeaseSeconds > 0 {
				leader += fmt.Sprintf(" (lease %ds over the bound)", e.LeaseSeconds)
			}
		}
		sync := "-"
		if s := p.Sync; s != nil {
			sync = formatAge(s.Renewed, now)
			if p.Election == nil || s.Holder != p.Election.Holder {
				sync += " by " + s.Holder
			}
			if s.Expired {
				sync += " (stale)"
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s", p.Pool, len(p.Members), leader, renewed, sync,
			joinOrDash(p.Delegated), joinOrDash(p.Tainted))
		if wide {
			fmt.Fprintf(tw, "\t%s", joinOrDash(p.Members))
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}

func joinOrDash(s []string) string { return orDash(strings.Join(s, ",")) }

// formatAge prints how long ago t was: "3s ago", "2m5s ago"; "-" for none.
func formatAge(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return age(t, now).String() + " ago"
}

// writeJSON prints v indented.
func writeJSON(stdout, stderr io.Writer, v any) int {
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		fmt.Fprintln(stderr, "tetherctl:", err)
		return exitError
	}
	return exitOK
}
