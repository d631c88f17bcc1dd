package testenv

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// The container images of tests with a real runtime. No registry is
// reachable from the test machines, so they are built here and imported.
const (
	// BusyboxImage has Debian's static busybox as /bin/busybox with a
	// symlink in /bin for every applet (sh, tar, cat, sleep, httpd, nc,
	// ...), empty /etc and /tmp, and PATH=/bin; its default command is sh.
	BusyboxImage = "tether.test/busybox:1"
	// PauseImage is the sandbox image: the same layer, running busybox's
	// sleep for ever (containerd stops sandboxes with SIGKILL).
	PauseImage = "tether.test/pause:1"
	// busyboxPath is where Debian's busybox-static installs busybox.
	busyboxPath = "/bin/busybox"
)

// imageTime is the modification time of every file in the images, so
// that the same busybox always makes the same bytes.
var imageTime = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// WriteImages writes BusyboxImage and PauseImage into dir as one
// docker-archive tarball (manifest.json, one config per image and their
// shared layer) for `ctr images import`, and returns its path. It takes
// milliseconds, so nothing is cached: the same busybox gives the same
// bytes.
func WriteImages(dir string) (string, error) {
	layer, err := busyboxLayer(busyboxPath)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(layer)
	layerID := hex.EncodeToString(sum[:])
	layerName := layerID + "/layer.tar"

	type entry struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	files := map[string][]byte{layerName: layer}
	var manifest []entry
	for _, img := range []struct {
		ref string
		cmd []string
	}{
		{BusyboxImage, []string{"/bin/sh"}},
		{PauseImage, []string{"/bin/sleep", "2147483647"}},
	} {
		config, err := json.Marshal(map[string]any{
			"architecture": runtime.GOARCH,
			"os":           "linux",
			"created":      imageTime,
			"config":       map[string]any{"Cmd": img.cmd, "Env": []string{"PATH=/bin"}, "WorkingDir": "/"},
			"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + layerID}},
		})
		if err != nil {
			return "", err
		}
		csum := sha256.Sum256(config)
		name := hex.EncodeToString(csum[:]) + ".json"
		files[name] = config
		manifest = append(manifest, entry{Config: name, RepoTags: []string{img.ref}, Layers: []string{layerName}})
	}
	m, err := json.Marshal(manifest)
	if err != nil {
		return "", err
	}
	files["manifest.json"] = m

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: layerID + "/", Mode: 0o755, ModTime: imageTime}); err != nil {
		return "", err
	}
	for _, name := range []string{layerName, manifest[0].Config, manifest[1].Config, "manifest.json"} {
		if err := writeTarFile(tw, name, 0o644, files[name]); err != nil {
			return "", err
		}
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	path := filepath.Join(dir, "images.tar")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		return "", fmt.Errorf("write images: %w", err)
	}
	return path, nil
}

// busyboxLayer is the images' one layer: busybox and its applet links.
func busyboxLayer(busybox string) ([]byte, error) {
	bin, err := os.ReadFile(busybox)
	if err != nil {
		return nil, fmt.Errorf("read busybox (Debian's busybox-static; make deps installs it): %w", err)
	}
	out, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("list busybox applets: %w", err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range []struct {
		name string
		mode int64
	}{{"bin/", 0o755}, {"etc/", 0o755}, {"tmp/", 0o1777}} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d.name, Mode: d.mode, ModTime: imageTime}); err != nil {
			return nil, err
		}
	}
	if err := writeTarFile(tw, "bin/busybox", 0o755, bin); err != nil {
		return nil, err
	}
	for _, applet := range strings.Fields(string(out)) {
		if applet == "busybox" || strings.Contains(applet, "/") {
			continue
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + applet, Linkname: "busybox", Mode: 0o777, ModTime: imageTime}); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func writeTarFile(tw *tar.Writer, name string, mode int64, data []byte) error {
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data)), ModTime: imageTime}); err != nil {
		return err
	}
	_, err := tw.Write(data)
	return err
}
