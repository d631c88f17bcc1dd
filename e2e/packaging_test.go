package e2e

// Tests of what packaging/ ships: the deb packages installed for real on
// this machine with dpkg (and purged), the rpm packages installed into a
// scratch root, the default configuration files against the strict loader
// and the systemd units against systemd-analyze. The container image and
// tetherctl are tested in image_test.go and tetherctl_test.go, the
// Kubernetes manifests in manifests_test.go.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/testenv"
)

// builtPackages is what `make package` wrote, by "<name>.<format>".
type builtPackages struct {
	files   map[string]string
	version string // the binaries' version (git describe)
}

var (
	pkgOnce  sync.Once
	pkgBuilt builtPackages
	pkgErr   error
)

// packages runs `make package` once per test binary with the version the
// test expects in the binaries, and returns the packages it wrote.
func packages(t *testing.T) builtPackages {
	t.Helper()
	pkgOnce.Do(func() {
		root := world.RepoRoot()
		version := "dev"
		if out, err := exec.Command("git", "-C", root, "describe", "--tags", "--always", "--dirty").Output(); err == nil {
			version = strings.TrimSpace(string(out))
		}
		start := time.Now()
		cmd := exec.Command("make", "-s", "-C", root, "package", "VERSION="+version)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			pkgErr = fmt.Errorf("make package: %v\n%s%s", err, out, stderr.String())
			return
		}
		pkgBuilt = builtPackages{files: map[string]string{}, version: version}
		for line := range strings.Lines(string(out)) {
			path := strings.TrimSpace(line)
			base := filepath.Base(path)
			for _, name := range []string{"tether-edge", "tether-gateway"} {
				for _, format := range []string{"deb", "rpm"} {
					if strings.HasPrefix(base, name) && strings.HasSuffix(base, "."+format) {
						pkgBuilt.files[name+"."+format] = path
					}
				}
			}
		}
		if len(pkgBuilt.files) != 4 {
			pkgErr = fmt.Errorf("make package printed %d packages, want 4:\n%s%s", len(pkgBuilt.files), out, stderr.String())
		}
		t.Logf("make package (version %s) in %v", version, time.Since(start).Round(time.Millisecond))
	})
	if pkgErr != nil {
		t.Fatal(pkgErr)
	}
	return pkgBuilt
}

// installed is a file a package installs, as the tests expect it.
type installed struct {
	path string
	mode fs.FileMode // type and permission bits
}

var edgeFiles = []installed{
	{"/usr/bin/tether-edge", 0o755},
	{"/usr/lib/systemd/system/tether-edge.service", 0o644},
	{"/etc/tether", fs.ModeDir | 0o755},
	{"/etc/tether/edge.yaml", 0o644},
	{"/var/lib/tether", fs.ModeDir | 0o750},
}

var gatewayFiles = []installed{
	{"/usr/bin/tether-gateway", 0o755},
	{"/usr/bin/tetherctl", 0o755},
	{"/usr/bin/kubectl-tether", fs.ModeSymlink | 0o777}, // → tetherctl
	{"/usr/lib/systemd/system/tether-gateway.service", 0o644},
	{"/etc/tether", fs.ModeDir | 0o755},
	{"/etc/tether/gateway.yaml", 0o644},
	{"/var/lib/tether-gateway", fs.ModeDir | 0o700},
}

// checkInstalled checks type, mode and root ownership of files under root.
func checkInstalled(t *testing.T, root string, files []installed) {
	t.Helper()
	for _, f := range files {
		fi, err := os.Lstat(filepath.Join(root, f.path))
		if err != nil {
			t.Errorf("installed file: %v", err)
			continue
		}
		if got := fi.Mode() & (fs.ModeType | fs.ModePerm); got != f.mode {
			t.Errorf("%s: mode %v, want %v", f.path, got, f.mode)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != 0 || st.Gid != 0 {
			t.Errorf("%s: owner %d:%d, want root:root", f.path, st.Uid, st.Gid)
		}
	}
}

func mustRun(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// exists reports whether path exists (Lstat).
func pathExists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// TestPackageDeb installs the deb packages on this machine, checks what
// they installed, then removes and purges them. The machine is left as it
// was, also when the test fails.
func TestPackageDeb(t *testing.T) {
	testenv.RequireRoot(t)
	for _, name := range []string{"tether-edge", "tether-gateway"} {
		if out, _ := exec.Command("dpkg-query", "-W", "-f=${db:Status-Status}", name).Output(); len(out) > 0 && string(out) != "not-installed" {
			t.Skipf("%s is %s on this machine: not touching it", name, out)
		}
	}
	for _, dir := range []string{"/etc/tether", "/var/lib/tether", "/var/lib/tether-gateway"} {
		if pathExists(dir) {
			t.Skipf("%s exists on this machine: not touching it", dir)
		}
	}
	pkgs := packages(t)

	// The operator's own file in /etc/tether, which purge must keep.
	const operatorFile = "/etc/tether/gateway-ca.crt"
	t.Cleanup(func() {
		out, err := exec.Command("dpkg", "--purge", "tether-edge", "tether-gateway").CombinedOutput()
		if err != nil {
			t.Errorf("cleanup: dpkg --purge: %v\n%s", err, out)
		}
		os.Remove(operatorFile)
		os.Remove("/etc/tether")
		os.RemoveAll("/var/lib/tether")
		os.RemoveAll("/var/lib/tether-gateway")
	})
	mustRun(t, "dpkg", "-i", pkgs.files["tether-edge.deb"], pkgs.files["tether-gateway.deb"])

	t.Run("files", func(t *testing.T) {
		checkInstalled(t, "/", append(edgeFiles, gatewayFiles...))
		for name, files := range map[string][]installed{"tether-edge": edgeFiles, "tether-gateway": gatewayFiles} {
			var want []string
			for _, f := range files {
				want = append(want, f.path)
			}
			if got := ownFiles(mustRun(t, "dpkg", "-L", name)); !cmp.Equal(sortedCopy(want), got) {
				t.Errorf("dpkg -L %s (-want +got):\n%s", name, cmp.Diff(sortedCopy(want), got))
			}
		}
		if got := mustRun(t, "dpkg-query", "-W", "-f=${Conffiles}", "tether-edge"); !strings.Contains(got, "/etc/tether/edge.yaml") {
			t.Errorf("tether-edge's conffiles: %q, want /etc/tether/edge.yaml", got)
		}
	})

	t.Run("not enabled", func(t *testing.T) {
		for _, unit := range []string{"tether-edge.service", "tether-gateway.service"} {
			if p := "/etc/systemd/system/multi-user.target.wants/" + unit; pathExists(p) {
				t.Errorf("%s exists: the package must not enable a service that has no configuration", p)
			}
		}
	})

	t.Run("versions", func(t *testing.T) {
		for _, bin := range []string{"tether-edge", "tether-gateway"} {
			if got, want := strings.TrimSpace(mustRun(t, "/usr/bin/"+bin, "--version")), bin+" "+pkgs.version; got != want {
				t.Errorf("%s --version = %q, want %q", bin, got, want)
			}
		}
		if got, want := strings.TrimSpace(mustRun(t, "/usr/bin/tetherctl", "version")), "tetherctl "+pkgs.version; got != want {
			t.Errorf("tetherctl version = %q, want %q", got, want)
		}
		if target, err := os.Readlink("/usr/bin/kubectl-tether"); err != nil || target != "tetherctl" {
			t.Errorf("/usr/bin/kubectl-tether links to %q (%v), want tetherctl", target, err)
		}
		if got := mustRun(t, "/usr/bin/kubectl-tether", "help"); !strings.HasPrefix(got, "Usage: kubectl tether ") {
			t.Errorf("kubectl-tether help does not name itself kubectl tether:\n%s", got)
		}
	})

	t.Run("systemd-analyze", func(t *testing.T) {
		for _, unit := range []string{"tether-edge.service", "tether-gateway.service"} {
			path := "/usr/lib/systemd/system/" + unit
			// verify loads the unit as the system manager would, offline,
			// and checks its settings and that ExecStart exists.
			if out, err := exec.Command("systemd-analyze", "--man=no", "verify", path).CombinedOutput(); err != nil || len(out) > 0 {
				t.Errorf("systemd-analyze verify %s: %v\n%s", unit, err, out)
			}
			// security rates the sandboxing; 2.5 of 10 is well inside "OK".
			if out, err := exec.Command("systemd-analyze", "security", "--offline=yes", "--threshold=25", path).CombinedOutput(); err != nil {
				t.Errorf("systemd-analyze security %s: exposure above 2.5: %v\n%s", unit, err, out)
			}
		}
	})

	t.Run("default configs", func(t *testing.T) {
		testDefaultConfig(t, "/usr/bin/tether-edge", "/etc/tether/edge.yaml", "nothing to do", "--admin-listen", "no-port")
		testDefaultConfig(t, "/usr/bin/tether-gateway", "/etc/tether/gateway.yaml", "--client-ca is required", "--max-streams-per-edge", "0")
	})

	// Data the edge wrote, and a file of the operator's.
	if err := os.WriteFile("/var/lib/tether/cache.db", []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(operatorFile, []byte("operator's"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile("/etc/tether/edge.yaml", []byte("gateway: [gw.example.com]\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	t.Run("remove keeps configuration and data", func(t *testing.T) {
		// Enabled by the operator (systemctl works on the files offline):
		// removing the package disables the service.
		const wants = "/etc/systemd/system/multi-user.target.wants/tether-edge.service"
		mustRun(t, "systemctl", "enable", "tether-edge.service")
		if !pathExists(wants) {
			t.Fatalf("systemctl enable made no %s", wants)
		}
		t.Cleanup(func() { os.Remove(wants) })
		mustRun(t, "dpkg", "--remove", "tether-edge", "tether-gateway")
		if pathExists(wants) {
			t.Errorf("%s is still there after dpkg --remove: the service stays enabled", wants)
		}
		for _, p := range []string{"/usr/bin/tether-edge", "/usr/bin/tether-gateway", "/usr/bin/tetherctl", "/usr/bin/kubectl-tether",
			"/usr/lib/systemd/system/tether-edge.service", "/usr/lib/systemd/system/tether-gateway.service"} {
			if pathExists(p) {
				t.Errorf("%s is still there after dpkg --remove", p)
			}
		}
		for _, p := range []string{"/etc/tether/edge.yaml", "/etc/tether/gateway.yaml", "/var/lib/tether/cache.db", operatorFile} {
			if !pathExists(p) {
				t.Errorf("%s is gone after dpkg --remove; docs/install.md says remove keeps it", p)
			}
		}
	})

	t.Run("purge leaves only the operator's files", func(t *testing.T) {
		mustRun(t, "dpkg", "--purge", "tether-edge", "tether-gateway")
		for _, name := range []string{"tether-edge", "tether-gateway"} {
			if out, _ := exec.Command("dpkg-query", "-W", "-f=${db:Status-Status}", name).Output(); len(out) > 0 && string(out) != "not-installed" {
				t.Errorf("%s is %s after purge", name, out)
			}
		}
		for _, dir := range []string{"/var/lib/tether", "/var/lib/tether-gateway"} {
			if pathExists(dir) {
				t.Errorf("%s is still there after purge", dir)
			}
		}
		var left []string
		filepath.WalkDir("/etc/tether", func(path string, d fs.DirEntry, err error) error {
			if err == nil {
				left = append(left, path)
			}
			return nil
		})
		if want := []string{"/etc/tether", operatorFile}; !cmp.Equal(want, left) {
			t.Errorf("/etc/tether after purge: %q, want only the operator's %s", left, operatorFile)
		}
	})
}

// ownFiles returns the paths of `dpkg -L` output that are the package's
// own, without the directories every system has.
func ownFiles(list string) []string {
	shared := []string{"/.", "/etc", "/usr", "/usr/bin", "/usr/lib", "/usr/lib/systemd", "/usr/lib/systemd/system", "/var", "/var/lib"}
	var own []string
	for _, l := range strings.Fields(list) {
		if !slices.Contains(shared, l) {
			own = append(own, l)
		}
	}
	return sortedCopy(own)
}

func sortedCopy(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// commentedKey is a line of a default config that shows a key, commented out.
var commentedKey = regexp.MustCompile(`(?m)^# ([a-z][a-z0-9-]*): .*$`)

// testDefaultConfig checks a shipped config file with the program itself:
// as shipped (all commented out) it loads and configures nothing, so the
// program stops with wantErr. It shows every setting of the program's
// --help; with them uncommented it still loads (every key is one the strict
// loader knows, every example value parses) and the program stops only at
// the invalid flag badFlag.
func testDefaultConfig(t *testing.T, bin, path, wantErr string, badFlag ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--config", path).CombinedOutput()
	if code := exitStatus(err); code != 2 || !strings.Contains(string(out), wantErr) || strings.Contains(string(out), "config file") {
		t.Errorf("%s --config %s: exit %d (%v), want 2 and %q:\n%s", bin, path, code, err, wantErr, out)
	}

	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc strings.Builder
	var keys []string
	for _, m := range commentedKey.FindAllStringSubmatch(string(data), -1) {
		doc.WriteString(strings.TrimPrefix(m[0], "# ") + "\n")
		keys = append(keys, m[1])
	}
	if d := cmp.Diff(settingFlags(t, bin), sortedCopy(keys)); d != "" {
		t.Errorf("%s shows other keys than %s --help has flags (-flags +keys):\n%s", path, bin, d)
	}
	uncommented := filepath.Join(t.TempDir(), filepath.Base(path))
	if err := os.WriteFile(uncommented, []byte(doc.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	args := append([]string{"--config", uncommented}, badFlag...)
	out, err = exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if code := exitStatus(err); code != 2 || !strings.Contains(string(out), badFlag[0]) || strings.Contains(string(out), "config file") {
		t.Errorf("%s with the example keys of %s uncommented: exit %d (%v), want 2 and only %s rejected:\n%s\nthe file:\n%s",
			bin, path, code, err, badFlag[0], out, doc.String())
	}
}

// settingFlags returns the flags bin --help lists that belong in its
// config file: all but --config and --version, and those whose help says
// they are not in this build yet.
func settingFlags(t *testing.T, bin string) []string {
	t.Helper()
	out, err := exec.Command(bin, "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --help: %v\n%s", bin, err, out)
	}
	var flags []string
	// Each flag is "  --name type" and its help on the indented lines below.
	for _, block := range strings.Split(string(out), "\n  --")[1:] {
		name := strings.Fields(block)[0]
		if name == "config" || name == "version" || strings.Contains(block, "not in this build yet") {
			continue
		}
		flags = append(flags, name)
	}
	return sortedCopy(flags)
}

func exitStatus(err error) int {
	if ee, ok := errors.AsType[*exec.ExitError](err); ok {
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// TestPackageRPM installs the rpm packages into a scratch root with
// Debian's rpm and checks the same files; the install scripts are checked
// as text (they cannot run without a system in the root).
func TestPackageRPM(t *testing.T) {
	testenv.RequireRoot(t)
	pkgs := packages(t)
	root := t.TempDir()
	edge, gw := pkgs.files["tether-edge.rpm"], pkgs.files["tether-gateway.rpm"]
	// Debian's rpm keeps its database in ~/.rpmdb; in the root, use the
	// usual place.
	rpm := func(args ...string) string {
		return mustRun(t, "rpm", append([]string{"--root", root, "--dbpath", "/var/lib/rpm"}, args...)...)
	}

	rpm("--initdb")
	rpm("--nodeps", "--noscripts", "-i", edge, gw)
	checkInstalled(t, root, append(edgeFiles, gatewayFiles...))
	if out := rpm("-V", "tether-edge", "tether-gateway"); out != "" {
		t.Errorf("rpm -V: files differ from the packages:\n%s", out)
	}
	if got := strings.Fields(rpm("-qc", "tether-edge", "tether-gateway")); !cmp.Equal(got, []string{"/etc/tether/edge.yaml", "/etc/tether/gateway.yaml"}) {
		t.Errorf("config files: %q", got)
	}
	if got := rpm("-q", "--qf", "[%{FILEFLAGS:fflags} %{FILENAMES}\n]", "tether-edge"); !strings.Contains(got, "cn /etc/tether/edge.yaml") {
		t.Errorf("/etc/tether/edge.yaml is not %%config(noreplace):\n%s", got)
	}
	for _, name := range []string{"tether-edge", "tether-gateway"} {
		bin := filepath.Join(root, "usr/bin", name)
		if got, want := strings.TrimSpace(mustRun(t, bin, "--version")), name+" "+pkgs.version; got != want {
			t.Errorf("%s --version = %q, want %q", name, got, want)
		}
	}

	scripts := mustRun(t, "rpm", "-qp", "--scripts", edge)
	for _, want := range []string{"postinstall scriptlet", "systemctl daemon-reload", "preuninstall scriptlet",
		"systemctl stop tether-edge.service", "postuninstall scriptlet"} {
		if !strings.Contains(scripts, want) {
			t.Errorf("tether-edge.rpm scripts lack %q:\n%s", want, scripts)
		}
	}
	if strings.Contains(scripts, "@") {
		t.Errorf("tether-edge.rpm scripts have a placeholder left:\n%s", scripts)
	}

	rpm("--nodeps", "--noscripts", "-e", "tether-edge", "tether-gateway")
	var left []string
	filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && !strings.HasPrefix(path, filepath.Join(root, "var/lib/rpm")) {
			left = append(left, path)
		}
		return nil
	})
	if len(left) > 0 || pathExists(filepath.Join(root, "etc/tether")) || pathExists(filepath.Join(root, "var/lib/tether")) {
		t.Errorf("left after rpm -e: %q", left)
	}
}
