// Command registrylayout writes an image from a docker-archive tar (as
// imagebuild writes them) into the directory layout that agnhost's
// fake-registry-server serves from /var/registry:
//
//	<dir>/<name>/manifests/<tag>                         the manifest's digest
//	<dir>/<name>/manifests/sha256/<xx>/<hash>/data       the manifest
//	<dir>/<name>/blobs/sha256/<xx>/<hash>/data           config and layers
//
// Upstream fills that directory by copying registry.k8s.io/pause:3.10.2 as
// pause:testing; here the local pause image plays that part.
//
// Usage:
//
//	registrylayout --archive pause.tar --dir /tmp/registry --name pause --tag testing
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func main() {
	archive := flag.String("archive", "", "docker-archive tar holding one image")
	dir := flag.String("dir", "", "registry directory to write")
	name := flag.String("name", "", "repository name (one path element)")
	tag := flag.String("tag", "", "tag to point at the image")
	flag.Parse()
	if *archive == "" || *dir == "" || *name == "" || *tag == "" {
		log.Fatal("registrylayout: --archive, --dir, --name and --tag are required")
	}
	if err := write(*archive, filepath.Join(*dir, *name), *tag); err != nil {
		log.Fatalf("registrylayout: %v", err)
	}
}

// blobPath is the registry storage path of a digest under base.
func blobPath(base string, d v1.Hash) string {
	return filepath.Join(base, d.Algorithm, d.Hex[:2], d.Hex, "data")
}

func writeFile(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

func write(archive, repo, tag string) error {
	img, err := tarball.ImageFromPath(archive, nil)
	if err != nil {
		return fmt.Errorf("read %s: %w", archive, err)
	}
	manifest, err := img.RawManifest()
	if err != nil {
		return fmt.Errorf("manifest: %w", err)
	}
	digest, err := img.Digest()
	if err != nil {
		return fmt.Errorf("digest: %w", err)
	}
	if err := writeFile(blobPath(filepath.Join(repo, "manifests"), digest), manifest); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(repo, "manifests", tag), []byte(digest.String()+"\n")); err != nil {
		return err
	}
	config, err := img.RawConfigFile()
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	configName, err := img.ConfigName()
	if err != nil {
		return fmt.Errorf("config digest: %w", err)
	}
	if err := writeFile(blobPath(filepath.Join(repo, "blobs"), configName), config); err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return fmt.Errorf("layers: %w", err)
	}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return fmt.Errorf("layer digest: %w", err)
		}
		rc, err := l.Compressed()
		if err != nil {
			return fmt.Errorf("layer %s: %w", d, err)
		}
		data, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return fmt.Errorf("layer %s: %w", d, err)
		}
		if err := writeFile(blobPath(filepath.Join(repo, "blobs"), d), data); err != nil {
			return err
		}
	}
	fmt.Printf("%s %s:%s\n", digest, filepath.Base(repo), tag)
	return nil
}
