// Command image assembles the seqinbox container image without a Docker engine or a registry:
// one layer with the static binary, a passwd entry for the non-root user and the machine's CA
// certificates, configured like the Dockerfile's image (entrypoint, user, labels, platform), and
// written as an OCI image layout tarball that `ctr images import` and `docker load` read. The
// local cluster's pause image (pause/) is built the same way with -path /pause.
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The non-root user of the image, the same numeric ids as the distroless nonroot user the
// Dockerfile runs as, so that manifests with runAsUser: 65532 fit both images.
const (
	uid  = 65532
	user = "nonroot"
)

// options are the flags.
type options struct {
	binary, path, caFile, ref, out, version, revision, source string
}

func main() {
	var o options
	flag.StringVar(&o.binary, "binary", "", "static binary to install (required)")
	flag.StringVar(&o.path, "path", "/seqinbox", "where the binary goes in the image; the image's entrypoint")
	flag.StringVar(&o.caFile, "ca-certificates", "/etc/ssl/certs/ca-certificates.crt", "CA bundle to install (Debian package ca-certificates)")
	flag.StringVar(&o.ref, "ref", "", "image reference the tarball carries, e.g. ghcr.io/seqinbox/seqinbox:v0.1.0 (required)")
	flag.StringVar(&o.out, "o", "", "OCI layout tarball to write (required)")
	flag.StringVar(&o.version, "version", "", "org.opencontainers.image.version label")
	flag.StringVar(&o.revision, "revision", "", "org.opencontainers.image.revision label")
	flag.StringVar(&o.source, "source", "https://github.com/seqinbox/seqinbox", "org.opencontainers.image.source label")
	flag.Parse()
	if o.binary == "" || o.ref == "" || o.out == "" {
		fmt.Fprintln(os.Stderr, "image: -binary, -ref and -o are required")
		flag.Usage()
		os.Exit(2)
	}
	if err := build(o); err != nil {
		fmt.Fprintf(os.Stderr, "image: %v\n", err)
		os.Exit(1)
	}
}

func build(o options) error {
	files, err := rootFiles(o)
	if err != nil {
		return err
	}
	layerTar, err := tarOf(files)
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return fmt.Errorf("layer: %w", err)
	}
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layer)
	if err != nil {
		return fmt.Errorf("append layer: %w", err)
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config = v1.Config{
		Entrypoint: []string{o.path},
		User:       fmt.Sprintf("%d:%d", uid, uid),
		WorkingDir: "/",
		Env: []string{
			"PATH=/usr/local/bin:/usr/bin:/bin",
			"SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
		},
		Labels: map[string]string{
			"org.opencontainers.image.title":    strings.TrimPrefix(o.path, "/"),
			"org.opencontainers.image.source":   o.source,
			"org.opencontainers.image.version":  o.version,
			"org.opencontainers.image.revision": o.revision,
		},
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	return writeLayoutTarball(img, o.ref, o.out)
}

// file is one entry of the image's only layer.
type file struct {
	name     string
	mode     int64
	uid      int
	dir      bool
	contents []byte
}

// rootFiles is the image's file system: what the distroless static image gives the binary.
func rootFiles(o options) ([]file, error) {
	bin, err := os.ReadFile(o.binary)
	if err != nil {
		return nil, fmt.Errorf("read binary: %w", err)
	}
	ca, err := os.ReadFile(o.caFile)
	if err != nil {
		return nil, fmt.Errorf("read CA certificates (install the Debian package ca-certificates): %w", err)
	}
	passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\n%s:x:%d:%d:%s:/home/%s:/sbin/nologin\n", user, uid, uid, user, user)
	group := fmt.Sprintf("root:x:0:\n%s:x:%d:\n", user, uid)
	return []file{
		{name: "etc/", mode: 0o755, dir: true},
		{name: "etc/passwd", mode: 0o644, contents: []byte(passwd)},
		{name: "etc/group", mode: 0o644, contents: []byte(group)},
		{name: "etc/ssl/", mode: 0o755, dir: true},
		{name: "etc/ssl/certs/", mode: 0o755, dir: true},
		{name: "etc/ssl/certs/ca-certificates.crt", mode: 0o644, contents: ca},
		{name: "home/", mode: 0o755, dir: true},
		{name: "home/" + user + "/", mode: 0o700, uid: uid, dir: true},
		{name: "tmp/", mode: 0o1777, dir: true},
		{name: strings.TrimPrefix(o.path, "/"), mode: 0o755, contents: bin},
	}, nil
}

// tarOf writes the layer with fixed timestamps and owners, so that the same inputs give the
// same digest.
func tarOf(files []file) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0).UTC()
	for _, f := range files {
		h := &tar.Header{Name: f.name, Mode: f.mode, Uid: f.uid, Gid: f.uid, ModTime: epoch, Format: tar.FormatPAX}
		if f.dir {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.contents))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("layer %s: %w", f.name, err)
		}
		if _, err := tw.Write(f.contents); err != nil {
			return nil, fmt.Errorf("layer %s: %w", f.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("layer: %w", err)
	}
	return buf.Bytes(), nil
}

// writeLayoutTarball writes an OCI image layout holding img under ref, as one tarball. The
// index entry names the image twice: org.opencontainers.image.ref.name for OCI tools and
// io.containerd.image.name, which `ctr images import` reads as the full reference.
func writeLayoutTarball(img v1.Image, ref, out string) error {
	dir, err := os.MkdirTemp(filepath.Dir(out), ".layout-")
	if err != nil {
		return fmt.Errorf("layout: %w", err)
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("layout: %w", err)
	}
	err = p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": ref,
		"io.containerd.image.name":          ref,
	}))
	if err != nil {
		return fmt.Errorf("layout: %w", err)
	}
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("write %s: %w", out, err)
	}
	tw := tar.NewWriter(f)
	err = errors.Join(tw.AddFS(os.DirFS(dir)), tw.Close(), f.Close())
	if err != nil {
		return fmt.Errorf("write %s: %w", out, err)
	}
	if err := os.Rename(tmp, out); err != nil {
		return fmt.Errorf("write %s: %w", out, err)
	}
	d, err := img.Digest()
	if err != nil {
		return fmt.Errorf("digest: %w", err)
	}
	fmt.Printf("image: wrote %s (%s, %s)\n", out, ref, d)
	return nil
}
