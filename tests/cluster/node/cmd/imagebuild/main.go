// Command imagebuild writes a container image archive (docker-archive tar,
// which `ctr images import` reads) from local files, with no registry and no
// Docker engine. Images are assembled with go-containerregistry.
//
// Usage:
//
//	imagebuild --out img.tar --tag registry.k8s.io/pause:3.10.2 \
//	    --add /path/on/host=/pause --entrypoint '["/pause"]'
//
// --add SRC=DST copies a host file into the image, keeping its mode (setuid,
// setgid and sticky bits included); --tree SRC=DST copies a host directory
// with its files, directories and symlinks; --link DST=TARGET adds a
// symlink; --dir DST adds an empty directory. Every entry is owned by root.
package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

// epoch keeps archives reproducible: the same inputs give the same digest.
var epoch = time.Unix(0, 0)

func main() {
	var tags, adds, trees, links, dirs, env list
	out := flag.String("out", "", "archive to write")
	entrypoint := flag.String("entrypoint", "", "JSON array: the image's entrypoint")
	cmd := flag.String("cmd", "", "JSON array: the image's default arguments")
	workdir := flag.String("workdir", "", "the image's working directory")
	user := flag.String("user", "", "the image's user (uid[:gid])")
	flag.Var(&tags, "tag", "image name to give the archive (repeatable)")
	flag.Var(&adds, "add", "SRC=DST: copy a host file into the image (repeatable)")
	flag.Var(&trees, "tree", "SRC=DST: copy a host directory tree into the image (repeatable)")
	flag.Var(&links, "link", "DST=TARGET: a symlink in the image (repeatable)")
	flag.Var(&dirs, "dir", "DST: an empty directory in the image (repeatable)")
	flag.Var(&env, "env", "K=V: an environment variable of the image (repeatable)")
	flag.Parse()
	if *out == "" || len(tags) == 0 {
		log.Fatal("imagebuild: --out and at least one --tag are required")
	}

	layerTar, err := buildLayer(adds, trees, links, dirs)
	if err != nil {
		log.Fatalf("imagebuild: %v", err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		log.Fatalf("imagebuild: layer: %v", err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		log.Fatalf("imagebuild: append layer: %v", err)
	}
	cfg := v1.Config{WorkingDir: *workdir, User: *user, Env: env}
	if len(cfg.Env) == 0 {
		cfg.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	}
	if err := parseArray(*entrypoint, &cfg.Entrypoint); err != nil {
		log.Fatalf("imagebuild: --entrypoint: %v", err)
	}
	if err := parseArray(*cmd, &cfg.Cmd); err != nil {
		log.Fatalf("imagebuild: --cmd: %v", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		log.Fatalf("imagebuild: config: %v", err)
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS, cf.Created, cf.Config = "amd64", "linux", v1.Time{Time: epoch}, cfg
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		log.Fatalf("imagebuild: config: %v", err)
	}
	refs := map[name.Reference]v1.Image{}
	for _, t := range tags {
		ref, err := name.NewTag(t)
		if err != nil {
			log.Fatalf("imagebuild: bad tag %q: %v", t, err)
		}
		refs[ref] = img
	}
	if err := tarball.MultiRefWriteToFile(*out, refs); err != nil {
		log.Fatalf("imagebuild: write %s: %v", *out, err)
	}
	d, _ := img.Digest()
	fmt.Printf("%s %s\n", d, strings.Join(tags, " "))
}

func parseArray(s string, into *[]string) error {
	if s == "" {
		return nil
	}
	return json.Unmarshal([]byte(s), into)
}

func splitPair(s string) (string, string, error) {
	a, b, ok := strings.Cut(s, "=")
	if !ok || a == "" || b == "" {
		return "", "", fmt.Errorf("%q is not A=B", s)
	}
	return a, b, nil
}

// tarMode is the tar header mode of a host file: permission bits plus the
// setuid, setgid and sticky bits.
func tarMode(m os.FileMode) int64 {
	mode := int64(m.Perm())
	if m&os.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&os.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&os.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}

// buildLayer writes one uncompressed tar layer holding the given files,
// trees, symlinks and directories, with the parent directories they need.
func buildLayer(adds, trees, links, dirs []string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	seen := map[string]bool{}
	var mkdirs func(p string) error
	mkdirs = func(p string) error {
		p = path.Clean(p)
		if p == "/" || p == "." || seen[p] {
			return nil
		}
		if err := mkdirs(path.Dir(p)); err != nil {
			return err
		}
		seen[p] = true
		mode := int64(0o755)
		if p == "/tmp" {
			mode = 0o1777
		}
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(p, "/") + "/", Mode: mode, ModTime: epoch})
	}
	for _, d := range append([]string{"/tmp", "/etc", "/proc", "/sys", "/dev"}, dirs...) {
		if err := mkdirs(d); err != nil {
			return nil, err
		}
	}
	addFile := func(src, dst string, st os.FileInfo) error {
		data, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		if err := mkdirs(path.Dir(dst)); err != nil {
			return err
		}
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(path.Clean(dst), "/"), Mode: tarMode(st.Mode()), Size: int64(len(data)), ModTime: epoch}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err = tw.Write(data)
		return err
	}
	sort.Strings(adds)
	for _, a := range adds {
		src, dst, err := splitPair(a)
		if err != nil {
			return nil, err
		}
		st, err := os.Stat(src)
		if err != nil {
			return nil, err
		}
		if err := addFile(src, dst, st); err != nil {
			return nil, err
		}
	}
	sort.Strings(trees)
	for _, t := range trees {
		src, dst, err := splitPair(t)
		if err != nil {
			return nil, err
		}
		// WalkDir visits in lexical order, so the layer is reproducible.
		err = filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(src, p)
			if err != nil {
				return err
			}
			target := path.Join(dst, filepath.ToSlash(rel))
			st, err := os.Lstat(p)
			if err != nil {
				return err
			}
			switch {
			case st.IsDir():
				return mkdirs(target)
			case st.Mode()&os.ModeSymlink != 0:
				link, err := os.Readlink(p)
				if err != nil {
					return err
				}
				if err := mkdirs(path.Dir(target)); err != nil {
					return err
				}
				return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: strings.TrimPrefix(path.Clean(target), "/"), Linkname: link, Mode: 0o777, ModTime: epoch})
			case st.Mode().IsRegular():
				return addFile(p, target, st)
			default:
				return fmt.Errorf("%s: not a file, directory or symlink", p)
			}
		})
		if err != nil {
			return nil, fmt.Errorf("--tree %s: %w", t, err)
		}
	}
	sort.Strings(links)
	for _, l := range links {
		dst, target, err := splitPair(l)
		if err != nil {
			return nil, err
		}
		if err := mkdirs(path.Dir(dst)); err != nil {
			return nil, err
		}
		hdr := &tar.Header{Typeflag: tar.TypeSymlink, Name: strings.TrimPrefix(path.Clean(dst), "/"), Linkname: target, Mode: 0o777, ModTime: epoch}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
