// Command etcd runs a single-member etcd server embedded from
// go.etcd.io/etcd/server/v3, for the local one-node cluster.
package main

import (
	"flag"
	"log"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	dataDir := flag.String("data-dir", "_output/local/etcd", "directory for etcd's data")
	clientURL := flag.String("listen-client-urls", "http://127.0.0.1:2379", "URL clients connect to")
	peerURL := flag.String("listen-peer-urls", "http://127.0.0.1:2380", "URL for peer traffic")
	flag.Parse()

	cfg := embed.NewConfig()
	cfg.Name = "local"
	cfg.Dir = *dataDir
	cfg.LogLevel = "warn"
	cu, err := url.Parse(*clientURL)
	if err != nil {
		log.Fatalf("etcd: bad --listen-client-urls %q: %v", *clientURL, err)
	}
	pu, err := url.Parse(*peerURL)
	if err != nil {
		log.Fatalf("etcd: bad --listen-peer-urls %q: %v", *peerURL, err)
	}
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		log.Fatalf("etcd: start: %v", err)
	}
	defer e.Close()

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case <-e.Server.ReadyNotify():
		log.Printf("etcd: ready, serving clients on %s", cu)
	case err := <-e.Err():
		log.Fatalf("etcd: %v", err)
	case <-sig:
		return
	}
	select {
	case err := <-e.Err():
		log.Fatalf("etcd: %v", err)
	case <-sig:
		log.Printf("etcd: shutting down")
	}
}
