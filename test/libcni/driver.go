// libcni-driver drives a CNI network configuration through the reference runtime library
// (github.com/containernetworking/cni/libcni) the way containerd (via go-cni) does, so e2e
// tests can check that a plugin works when a real runtime calls it.
//
// Usage:
//
//	libcni-driver <add|del|check|status|gc|features> --conf-dir DIR --bin-dir DIR[:DIR...]
//	    (--cache-dir DIR | --default-cache-dir) --netns PATH --container-id ID [--ifname eth0]
//	    [--args K=V;K=V] [--runtime-config JSON] [--valid-attachments JSON] [--report-time]
//	libcni-driver batch --conf-dir DIR --bin-dir DIR[:DIR...] --cache-dir DIR [--concurrency K]
//	    (requests as JSON lines on stdin: batch.go)
//
// --default-cache-dir leaves the cache dir to libcni itself (NewCNIConfig: libcni.CacheDir,
// /var/lib/cni, as containerd and CRI-O run it). So that no test ever writes the host's runtime
// cache, it is refused unless that directory is a tmpfs (a node sandbox's private mount,
// test/helpers/node-sandbox.ts).
//
// add prints the result JSON on stdout. status and gc exist only in libcni >= 1.2; with an
// older library they fail with exit code 2 ("unsupported"). features prints, as JSON, the
// library functions this build has. Any failure: exit 1, error text on stderr; a plugin's
// CNI error adds a last line "libcni-driver: CNI error code N" (the code a runtime sees).
//
// Built with GOPATH mode against Debian's golang-github-appc-cni-dev (see
// hack/build-libcni-driver.sh); it uses only the standard library and libcni.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
)

const (
	exitFailure     = 1
	exitUnsupported = 2
	exitUsage       = 64
)

type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

type unsupportedError struct{ fn string }

func (e unsupportedError) Error() string {
	return fmt.Sprintf("unsupported: this libcni has no %s (needs libcni >= 1.2.0)", e.fn)
}

type options struct {
	confDir          string
	binDirs          []string
	cacheDir         string
	defaultCacheDir  bool
	netns            string
	containerID      string
	ifName           string
	args             [][2]string
	capabilityArgs   map[string]interface{}
	validAttachments json.RawMessage
	timeout          time.Duration
	reportTime       bool
}

func main() {
	err := run(os.Args[1:])
	if err == nil {
		return
	}
	fmt.Fprintf(os.Stderr, "libcni-driver: %v\n", err)
	var cniErr *types.Error
	if errors.As(err, &cniErr) {
		fmt.Fprintf(os.Stderr, "libcni-driver: CNI error code %d\n", cniErr.Code)
	}
	var ue usageError
	var un unsupportedError
	switch {
	case errors.As(err, &ue):
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(exitUsage)
	case errors.As(err, &un):
		os.Exit(exitUnsupported)
	default:
		os.Exit(exitFailure)
	}
}

const usage = `usage: libcni-driver <add|del|check|status|gc|features> --conf-dir DIR --bin-dir DIR[:DIR...] (--cache-dir DIR | --default-cache-dir) --netns PATH --container-id ID [--ifname eth0] [--args K=V;K=V] [--runtime-config JSON] [--valid-attachments JSON] [--report-time]
       libcni-driver batch --conf-dir DIR --bin-dir DIR[:DIR...] --cache-dir DIR [--concurrency K] [--timeout D] < requests (JSON lines)`

func run(argv []string) error {
	if len(argv) < 1 {
		return usageError{"missing command"}
	}
	cmd := argv[0]
	if cmd == "features" {
		return printJSON(features())
	}
	if cmd == "batch" {
		return runBatch(argv[1:], os.Stdin, os.Stdout)
	}
	opts, err := parseOptions(cmd, argv[1:])
	if err != nil {
		return err
	}
	if opts.defaultCacheDir {
		if err := checkSandboxedCacheDir(libcni.CacheDir); err != nil {
			return err
		}
	}
	// Report a missing library function before touching any config.
	if f := features().Functions; cmd == "status" && !f["GetStatusNetworkList"] {
		return unsupportedError{"GetStatusNetworkList"}
	} else if cmd == "gc" && !f["GCNetworkList"] {
		return unsupportedError{"GCNetworkList"}
	}

	list, err := loadFirstConfList(opts.confDir)
	if err != nil {
		return err
	}
	var cni *libcni.CNIConfig
	if opts.defaultCacheDir {
		cni = libcni.NewCNIConfig(opts.binDirs, nil)
	} else {
		cni = libcni.NewCNIConfigWithCacheDir(opts.binDirs, opts.cacheDir, nil)
	}
	rt := &libcni.RuntimeConf{
		ContainerID:    opts.containerID,
		NetNS:          opts.netns,
		IfName:         opts.ifName,
		Args:           opts.args,
		CapabilityArgs: opts.capabilityArgs,
	}
	ctx, cancel := context.WithTimeout(context.Background(), opts.timeout)
	defer cancel()
	if opts.reportTime {
		// The call alone, as a runtime that links libcni sees it: without this process's start and
		// the config's loading (containerd loads it when the conf dir changes, not per call).
		started := time.Now()
		defer func() {
			fmt.Fprintf(os.Stderr, "libcni-driver: libcni call %.3f ms\n", float64(time.Since(started).Microseconds())/1000)
		}()
	}

	switch cmd {
	case "add":
		res, err := cni.AddNetworkList(ctx, list, rt)
		if err != nil {
			return fmt.Errorf("add network list %q: %w", list.Name, err)
		}
		// Print the result in the conflist's cniVersion, as the runtime receives it.
		return res.PrintTo(os.Stdout)
	case "del":
		if err := cni.DelNetworkList(ctx, list, rt); err != nil {
			return fmt.Errorf("del network list %q: %w", list.Name, err)
		}
		return nil
	case "check":
		if err := cni.CheckNetworkList(ctx, list, rt); err != nil {
			return fmt.Errorf("check network list %q: %w", list.Name, err)
		}
		return nil
	case "status":
		// libcni >= 1.2: GetStatusNetworkList(ctx, list) error.
		st, ok := interface{}(cni).(interface {
			GetStatusNetworkList(context.Context, *libcni.NetworkConfigList) error
		})
		if !ok {
			return unsupportedError{"GetStatusNetworkList"}
		}
		if err := st.GetStatusNetworkList(ctx, list); err != nil {
			return fmt.Errorf("status network list %q: %w", list.Name, err)
		}
		return nil
	case "gc":
		return gc(ctx, cni, list, opts)
	}
	return usageError{fmt.Sprintf("unknown command %q", cmd)}
}

func parseOptions(cmd string, argv []string) (*options, error) {
	switch cmd {
	case "add", "del", "check", "status", "gc":
	default:
		return nil, usageError{fmt.Sprintf("unknown command %q", cmd)}
	}
	fs := flag.NewFlagSet("libcni-driver "+cmd, flag.ContinueOnError)
	fs.SetOutput(new(bytes.Buffer)) // errors are reported once, by main
	confDir := fs.String("conf-dir", "", "directory of .conflist/.conf/.json network configs")
	binDir := fs.String("bin-dir", "", "plugin directories, colon separated")
	cacheDir := fs.String("cache-dir", "", "libcni cache directory")
	defaultCacheDir := fs.Bool("default-cache-dir", false, "use libcni's own default cache dir (only where it is a tmpfs)")
	netns := fs.String("netns", "", "network namespace path")
	containerID := fs.String("container-id", "", "container ID")
	ifName := fs.String("ifname", "eth0", "interface name inside the namespace")
	args := fs.String("args", "", "CNI_ARGS, K=V;K=V")
	runtimeConfig := fs.String("runtime-config", "", "capability args (runtimeConfig) as a JSON object")
	valid := fs.String("valid-attachments", "", `gc only: JSON array of {"containerID":..,"ifname":..} to keep`)
	timeout := fs.Duration("timeout", 60*time.Second, "overall timeout")
	reportTime := fs.Bool("report-time", false, `print "libcni-driver: libcni call N ms" on stderr: the libcni call's own time`)
	if err := fs.Parse(argv); err != nil {
		return nil, usageError{err.Error()}
	}
	if fs.NArg() > 0 {
		return nil, usageError{fmt.Sprintf("unexpected arguments: %q", fs.Args())}
	}
	var err error
	o := &options{
		confDir:         *confDir,
		cacheDir:        *cacheDir,
		defaultCacheDir: *defaultCacheDir,
		netns:           *netns,
		containerID:     *containerID,
		ifName:          *ifName,
		timeout:         *timeout,
		reportTime:      *reportTime,
	}
	o.binDirs = splitDirs(*binDir)
	if o.confDir == "" {
		return nil, usageError{"--conf-dir is required"}
	}
	if len(o.binDirs) == 0 {
		return nil, usageError{"--bin-dir is required"}
	}
	switch {
	case o.defaultCacheDir && o.cacheDir != "":
		return nil, usageError{"--cache-dir and --default-cache-dir exclude each other"}
	case !o.defaultCacheDir && o.cacheDir == "":
		return nil, usageError{"--cache-dir is required (or --default-cache-dir, inside a node sandbox; never the host's /var/lib/cni)"}
	}
	switch cmd {
	case "add", "check":
		if o.netns == "" {
			return nil, usageError{"--netns is required for " + cmd}
		}
		fallthrough
	case "del":
		if o.containerID == "" {
			return nil, usageError{"--container-id is required for " + cmd}
		}
		if o.ifName == "" {
			return nil, usageError{"--ifname must not be empty"}
		}
	}
	if o.args, err = parseCniArgs(*args); err != nil {
		return nil, usageError{"--args: " + err.Error()}
	}
	if *runtimeConfig != "" {
		// UseNumber keeps integers such as rates exact instead of float64 (1e+18).
		dec := json.NewDecoder(strings.NewReader(*runtimeConfig))
		dec.UseNumber()
		if err := dec.Decode(&o.capabilityArgs); err != nil {
			return nil, usageError{fmt.Sprintf("--runtime-config: not a JSON object: %v", err)}
		}
		if o.capabilityArgs == nil {
			return nil, usageError{"--runtime-config: not a JSON object"}
		}
	}
	if *valid != "" {
		if cmd != "gc" {
			return nil, usageError{"--valid-attachments is only for gc"}
		}
		if !json.Valid([]byte(*valid)) {
			return nil, usageError{"--valid-attachments: not valid JSON"}
		}
		o.validAttachments = json.RawMessage(*valid)
	}
	return o, nil
}

// splitDirs splits a colon-separated directory list (CNI_PATH style), skipping empty entries.
func splitDirs(list string) []string {
	var out []string
	for _, d := range strings.Split(list, ":") {
		if d != "" {
			out = append(out, d)
		}
	}
	return out
}

// parseCniArgs splits CNI_ARGS text, K=V;K=V, into libcni's RuntimeConf.Args pairs.
func parseCniArgs(text string) ([][2]string, error) {
	var out [][2]string
	for _, kv := range strings.Split(text, ";") {
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%q is not K=V", kv)
		}
		out = append(out, [2]string{k, v})
	}
	return out, nil
}

// checkSandboxedCacheDir refuses libcni's default cache dir unless it is a tmpfs: the host's
// /var/lib/cni belongs to the machine's container runtimes.
func checkSandboxedCacheDir(dir string) error {
	const tmpfsMagic = 0x01021994
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return fmt.Errorf("--default-cache-dir: libcni's default cache dir %s: %w", dir, err)
	}
	if st.Type != tmpfsMagic {
		return fmt.Errorf("--default-cache-dir: libcni's default cache dir %s is not a tmpfs: refusing to write the host's runtime cache (run inside a node sandbox)", dir)
	}
	return nil
}

// loadFirstConfList loads the lexically first network config in dir, as go-cni's
// loadFromConfDir does: .conflist via ConfListFromFile, .conf/.json via ConfFromFile
// wrapped with ConfListFromConf.
func loadFirstConfList(dir string) (*libcni.NetworkConfigList, error) {
	files, err := libcni.ConfFiles(dir, []string{".conf", ".conflist", ".json"})
	if err != nil {
		return nil, fmt.Errorf("read conf dir %s: %w", dir, err)
	}
	sort.Strings(files)
	if len(files) == 0 {
		return nil, libcni.NoConfigsFoundError{Dir: dir}
	}
	file := files[0]
	if strings.HasSuffix(file, ".conflist") {
		list, err := libcni.ConfListFromFile(file)
		if err != nil {
			return nil, fmt.Errorf("load conflist %s: %w", file, err)
		}
		if len(list.Plugins) == 0 {
			return nil, fmt.Errorf("conflist %s has no plugins", file)
		}
		return list, nil
	}
	conf, err := libcni.ConfFromFile(file)
	if err != nil {
		return nil, fmt.Errorf("load conf %s: %w", file, err)
	}
	if conf.Network.Type == "" {
		return nil, fmt.Errorf("conf %s has no plugin type", file)
	}
	list, err := libcni.ConfListFromConf(conf)
	if err != nil {
		return nil, fmt.Errorf("conf %s to conflist: %w", filepath.Base(file), err)
	}
	return list, nil
}

// gc calls GCNetworkList(ctx, list, *GCArgs) when this libcni has it (>= 1.2). GCArgs does
// not exist in older libcni, so the call goes through reflection to keep one source file
// that builds against both; the args are filled from JSON
// ({"ValidAttachments":[{"containerID":..,"ifname":..}]}).
func gc(ctx context.Context, cni *libcni.CNIConfig, list *libcni.NetworkConfigList, o *options) error {
	m := reflect.ValueOf(cni).MethodByName("GCNetworkList")
	if !m.IsValid() {
		return unsupportedError{"GCNetworkList"}
	}
	mt := m.Type()
	if mt.NumIn() != 3 || mt.In(2).Kind() != reflect.Ptr || mt.NumOut() != 1 {
		return fmt.Errorf("GCNetworkList has an unexpected signature %s", mt)
	}
	gcArgs := reflect.New(mt.In(2).Elem())
	valid := o.validAttachments
	if valid == nil {
		valid = json.RawMessage("[]")
	}
	raw, _ := json.Marshal(map[string]json.RawMessage{"ValidAttachments": valid})
	if err := json.Unmarshal(raw, gcArgs.Interface()); err != nil {
		return usageError{fmt.Sprintf("--valid-attachments: %v", err)}
	}
	out := m.Call([]reflect.Value{reflect.ValueOf(ctx), reflect.ValueOf(list), gcArgs})
	if errv := out[0]; !errv.IsNil() {
		return fmt.Errorf("gc network list %q: %w", list.Name, errv.Interface().(error))
	}
	return nil
}

type featureReport struct {
	Functions         map[string]bool `json:"functions"`
	SupportedVersions []string        `json:"supportedVersions"`
	Commands          []string        `json:"commands"`
}

// features reports which libcni entry points this build has.
func features() featureReport {
	t := reflect.TypeOf(&libcni.CNIConfig{})
	fns := map[string]bool{}
	for _, name := range []string{
		"AddNetworkList", "CheckNetworkList", "DelNetworkList",
		"GetNetworkListCachedResult", "GetNetworkListCachedConfig", "ValidateNetworkList",
		"GetStatusNetworkList", "GCNetworkList", "GetCachedAttachments",
	} {
		_, ok := t.MethodByName(name)
		fns[name] = ok
	}
	cmds := []string{"add", "del", "check"}
	if fns["GetStatusNetworkList"] {
		cmds = append(cmds, "status")
	}
	if fns["GCNetworkList"] {
		cmds = append(cmds, "gc")
	}
	return featureReport{
		Functions:         fns,
		SupportedVersions: version.All.SupportedVersions(),
		Commands:          cmds,
	}
}

func printJSON(v interface{}) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
