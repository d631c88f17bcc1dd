package cli

import (
	"bufio"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// cgroupMemoryMax returns the memory limit of the cgroup this process runs
// in, read from procCgroup (/proc/self/cgroup) and the cgroup file
// systems under root (/sys/fs/cgroup), and whether there is one. With
// cgroup v2 it is the smallest memory.max of the process's cgroup and its
// ancestors (a limit on a parent slice binds too); with v1, the memory
// controller's memory.limit_in_bytes (a value near the largest int64 means
// none). A cgroup path that is not mounted here (a container without its
// own cgroup namespace) reads as no limit.
func cgroupMemoryMax(procCgroup, root string) (int64, bool, error) {
	f, err := os.Open(procCgroup)
	if err != nil {
		return 0, false, err
	}
	defer f.Close()
	var v1, v2 string
	haveV2 := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// hierarchy-ID:controller-list:cgroup-path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2, haveV2 = parts[2], true
		case slices.Contains(strings.Split(parts[1], ","), "memory"):
			v1 = parts[2]
		}
	}
	if err := sc.Err(); err != nil {
		return 0, false, fmt.Errorf("read %s: %w", procCgroup, err)
	}
	if v1 != "" {
		n, ok, err := readLimit(filepath.Join(root, "memory", v1, "memory.limit_in_bytes"))
		if err != nil || !ok || n >= 1<<62 {
			return 0, false, err
		}
		return n, true, nil
	}
	if !haveV2 {
		return 0, false, nil
	}
	var limit int64
	found := false
	for p := path.Clean("/" + v2); ; p = path.Dir(p) {
		if n, ok, err := readLimit(filepath.Join(root, p, "memory.max")); err != nil {
			return 0, false, err
		} else if ok && (!found || n < limit) {
			limit, found = n, true
		}
		if p == "/" {
			return limit, found, nil
		}
	}
}

// readLimit reads a cgroup limit file: a number of bytes, or "max" (none).
// A file that does not exist is no limit.
func readLimit(file string) (int64, bool, error) {
	b, err := os.ReadFile(file)
	if os.IsNotExist(err) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, false, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("%s: %q is not a number of bytes", file, s)
	}
	return n, true, nil
}
