// Command csi-registrar registers a CSI driver with a node agent through the
// plugin registration API (k8s.io/kubelet/pkg/apis/pluginregistration/v1),
// the job upstream node-driver-registrar does beside a driver: it serves
// Registration on <registration-dir>/<driver-name>-reg.sock, answers GetInfo
// with the driver's name, its CSI endpoint and the CSI versions it speaks,
// and logs what the agent reports with NotifyRegistrationStatus. The socket
// is removed when the command stops (SIGTERM, SIGINT), which tells the agent
// the driver is gone.
//
// The local cluster's CSI stack (hack/csi-stack.sh) runs it for the
// project's hostpath test driver, so that the kubelet and rustlet see the
// driver registered the same way. (A Rust gRPC server cannot be the
// registrar for the kubelet: the kubelet's registration client sends the
// socket's path as the HTTP/2 :authority, which the Rust server's HTTP/2
// layer refuses as malformed.)
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"syscall"

	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// A CSI driver name: at most 63 characters, a DNS subdomain of lower-case
// letters, digits, dashes and dots (the CSI spec's rule, which the agent
// checks too).
var driverName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$`)

type registrar struct {
	registerapi.UnimplementedRegistrationServer
	name, endpoint string
}

func (r *registrar) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              r.name,
		Endpoint:          r.endpoint,
		SupportedVersions: []string{"1.0.0"},
	}, nil
}

func (r *registrar) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if s.PluginRegistered {
		log.Printf("%s: registered with the node agent", r.name)
	} else {
		log.Printf("%s: the node agent refused the registration: %s", r.name, s.Error)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

func run() error {
	name := flag.String("driver-name", "", "the CSI driver's name")
	endpoint := flag.String("csi-address", "", "the driver's CSI socket, as the agent dials it")
	dir := flag.String("registration-dir", "", "the agent's plugin registration directory (<root-dir>/plugins_registry)")
	flag.Parse()
	if !driverName.MatchString(*name) {
		return fmt.Errorf("--driver-name %q is not a CSI driver name", *name)
	}
	if *endpoint == "" || *dir == "" {
		return fmt.Errorf("--csi-address and --registration-dir are required")
	}
	if err := os.MkdirAll(*dir, 0o750); err != nil {
		return err
	}
	socket := filepath.Join(*dir, *name+"-reg.sock")
	if err := os.Remove(socket); err != nil && !os.IsNotExist(err) {
		return err
	}
	listener, err := net.Listen("unix", socket)
	if err != nil {
		return err
	}
	server := grpc.NewServer()
	registerapi.RegisterRegistrationServer(server, &registrar{name: *name, endpoint: *endpoint})
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		server.Stop()
	}()
	log.Printf("%s: serving registration on %s (CSI endpoint %s)", *name, socket, *endpoint)
	err = server.Serve(listener)
	if rmErr := os.Remove(socket); rmErr != nil && !os.IsNotExist(rmErr) {
		log.Printf("removing %s: %v", socket, rmErr)
	}
	return err
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "csi-registrar: %v\n", err)
		os.Exit(1)
	}
}
