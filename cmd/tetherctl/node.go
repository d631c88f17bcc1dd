package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/tether-edge/tether/internal/retired"
)

// nodeRBAC says what `tetherctl node` needs, for Forbidden errors.
const nodeRBAC = "tetherctl node needs get, create and update on configmaps in " + retired.Namespace +
	" and delete on nodes: an admin kubeconfig has them"

// retiredNode is a line of `tetherctl node retired`.
type retiredNode struct {
	Node    string    `json:"node"`
	Retired time.Time `json:"retired"`
	// Invalid is set when the record's value does not parse: every
	// certificate of the name is then retired.
	Invalid string `json:"invalid,omitempty"`
}

// node runs `tetherctl node retire|unretire NAME` and `tetherctl node
// retired` (internal/retired).
func node(ctx context.Context, o options, args []string, stdout, stderr io.Writer) int {
	usage := func() int {
		fmt.Fprintf(stderr, "%[1]s node: want `%[1]s node retire NAME`, `%[1]s node unretire NAME` or `%[1]s node retired`\n", o.prog)
		return exitUsage
	}
	if len(args) == 0 {
		return usage()
	}
	sub, names := args[0], args[1:]
	switch {
	case sub == "retired" && len(names) == 0:
	case (sub == "retire" || sub == "unretire") && len(names) == 1:
		if errs := validation.IsDNS1123Subdomain(names[0]); len(errs) > 0 {
			fmt.Fprintf(stderr, "%s node %s: %q is not a node name: %s\n", o.prog, sub, names[0], errs[0])
			return exitUsage
		}
	default:
		return usage()
	}
	client, err := kubeClient(o)
	if err != nil {
		fmt.Fprintf(stderr, "%s node %s: %v\n", o.prog, sub, err)
		return exitError
	}
	switch sub {
	case "retire":
		err = retireNode(ctx, client, names[0], time.Now(), stdout)
	case "unretire":
		err = unretireNode(ctx, client, names[0], stdout)
	default:
		var ns []retiredNode
		if ns, err = readRetired(ctx, client); err == nil {
			if o.output == "json" {
				return writeJSON(stdout, stderr, ns)
			}
			writeRetiredTable(stdout, ns, time.Now())
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s node %s: %v\n", o.prog, sub, err)
		return exitError
	}
	return exitOK
}

// retireNode records name as retired at now, then deletes its Node if it
// exists: in that order, so that the gateways close its tunnel before
// the Node goes and a new registration by the old key is refused.
func retireNode(ctx context.Context, client kubernetes.Interface, name string, now time.Time, w io.Writer) error {
	at := retired.Format(now)
	if err := editRecord(ctx, client, func(data map[string]string) { data[name] = at }); err != nil {
		return err
	}
	deleted := "its Node was deleted"
	switch err := client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); {
	case apierrors.IsNotFound(err):
		deleted = "it has no Node"
	case err != nil:
		return nodeError("delete node "+name+" (it is retired already; delete its Node with kubectl)", err)
	}
	fmt.Fprintf(w, "node %s retired at %s; %s.\n"+
		"Its certificates issued until then get no tunnel, and kube-apiserver refuses the name's Node registrations and certificate requests.\n"+
		"Onboard the machine that replaces it under a new name, or under this one once its old certificates have expired (then: unretire).\n",
		name, at, deleted)
	return nil
}

// unretireNode removes name from the record.
func unretireNode(ctx context.Context, client kubernetes.Interface, name string, w io.Writer) error {
	was := false
	if err := editRecord(ctx, client, func(data map[string]string) {
		_, was = data[name]
		delete(data, name)
	}); err != nil {
		return err
	}
	if !was {
		fmt.Fprintf(w, "node %s was not retired.\n", name)
		return nil
	}
	fmt.Fprintf(w, "node %s is no longer retired: every certificate of the name is accepted again.\n", name)
	return nil
}

// editRecord applies edit to the record's data and stores it, creating
// the ConfigMap when there is none, retrying on conflicts.
func editRecord(ctx context.Context, client kubernetes.Interface, edit func(map[string]string)) error {
	cms := client.CoreV1().ConfigMaps(retired.Namespace)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := cms.Get(ctx, retired.ConfigMap, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: retired.ConfigMap, Namespace: retired.Namespace}, Data: map[string]string{}}
			edit(cm.Data)
			_, err = cms.Create(ctx, cm, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(corev1.Resource("configmaps"), retired.ConfigMap, err)
			}
			return err
		}
		if err != nil {
			return err
		}
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		edit(cm.Data)
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return nodeError("update "+retired.Namespace+"/"+retired.ConfigMap, err)
	}
	return nil
}

// readRetired lists the record, by name.
func readRetired(ctx context.Context, client kubernetes.Interface) ([]retiredNode, error) {
	cm, err := client.CoreV1().ConfigMaps(retired.Namespace).Get(ctx, retired.ConfigMap, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return []retiredNode{}, nil
	}
	if err != nil {
		return nil, nodeError("read "+retired.Namespace+"/"+retired.ConfigMap, err)
	}
	ns := []retiredNode{}
	for _, name := range slices.Sorted(maps.Keys(cm.Data)) {
		n := retiredNode{Node: name}
		if n.Retired, err = retired.Parse(cm.Data[name]); err != nil {
			n.Invalid = err.Error()
		}
		ns = append(ns, n)
	}
	return ns, nil
}

func writeRetiredTable(w io.Writer, ns []retiredNode, now time.Time) {
	if len(ns) == 0 {
		fmt.Fprintln(w, "no retired nodes")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tRETIRED\tAGE")
	for _, n := range ns {
		if n.Invalid != "" {
			fmt.Fprintf(tw, "%s\tforever (%s)\t-\n", n.Node, n.Invalid)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", n.Node, retired.Format(n.Retired), formatAge(n.Retired, now))
	}
	tw.Flush()
}

// nodeError says what was being done and, when the apiserver refused it,
// what tetherctl node needs.
func nodeError(what string, err error) error {
	if apierrors.IsForbidden(err) {
		return fmt.Errorf("%s: %w; %s", what, err, nodeRBAC)
	}
	return fmt.Errorf("%s: %w", what, err)
}
