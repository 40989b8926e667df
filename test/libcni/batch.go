package main

// batch: many ADDs or DELs from one runtime process, as containerd makes them. Its CRI plugin calls
// libcni in-process (through go-cni), one goroutine per sandbox, with the network config loaded
// once; the one-call-per-process commands of driver.go add a Go runtime's start and a fork from the
// caller to every call, which no runtime pays.
//
// Requests, one JSON object per line on stdin:
//
//	{"cmd":"add"|"del","netns":PATH,"containerId":ID,"ifName":"eth0","args":"K=V;K=V","runtimeConfig":{...}}
//
// They start in input order, at most --concurrency at a time. Each answer is a JSON line on stdout
// in completion order, {"i":N,"startMs":..,"endMs":..,"error":".."} (times from the start of the
// batch, which is after the config was loaded), and a last line {"wallMs":..}: from the first
// start to the last end. A failed request does not stop the others; the exit code is 1 if any
// failed.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"
)

type batchRequest struct {
	Cmd           string                 `json:"cmd"`
	Netns         string                 `json:"netns"`
	ContainerID   string                 `json:"containerId"`
	IfName        string                 `json:"ifName"`
	Args          string                 `json:"args"`
	RuntimeConfig map[string]interface{} `json:"runtimeConfig"`
}

type batchAnswer struct {
	I       int     `json:"i"`
	StartMs float64 `json:"startMs"`
	EndMs   float64 `json:"endMs"`
	Error   string  `json:"error,omitempty"`
	// An ADD's result, in the conflist's cniVersion as the runtime receives it.
	Result json.RawMessage `json:"result,omitempty"`
}

func runBatch(argv []string, in io.Reader, out io.Writer) error {
	fs := flag.NewFlagSet("libcni-driver batch", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	confDir := fs.String("conf-dir", "", "directory of network configs")
	binDir := fs.String("bin-dir", "", "plugin directories, colon separated")
	cacheDir := fs.String("cache-dir", "", "libcni cache directory")
	concurrency := fs.Int("concurrency", 8, "requests in flight at once")
	timeout := fs.Duration("timeout", 60*time.Second, "timeout of each request")
	if err := fs.Parse(argv); err != nil {
		return usageError{err.Error()}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("unexpected arguments: %q", fs.Args())}
	}
	binDirs := splitDirs(*binDir)
	switch {
	case *confDir == "" || len(binDirs) == 0 || *cacheDir == "":
		return usageError{"batch needs --conf-dir, --bin-dir and --cache-dir"}
	case *concurrency < 1:
		return usageError{"--concurrency must be at least 1"}
	}

	var reqs []batchRequest
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for line := 1; sc.Scan(); line++ {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		dec := json.NewDecoder(strings.NewReader(sc.Text()))
		dec.UseNumber() // rates stay exact integers
		var r batchRequest
		if err := dec.Decode(&r); err != nil {
			return usageError{fmt.Sprintf("request line %d: %v", line, err)}
		}
		if (r.Cmd != "add" && r.Cmd != "del") || r.ContainerID == "" || (r.Cmd == "add" && r.Netns == "") {
			return usageError{fmt.Sprintf("request line %d: needs cmd add|del, containerId, and netns for add", line)}
		}
		if r.IfName == "" {
			r.IfName = "eth0"
		}
		reqs = append(reqs, r)
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("reading requests: %w", err)
	}

	list, err := loadFirstConfList(*confDir)
	if err != nil {
		return err
	}
	cni := libcni.NewCNIConfigWithCacheDir(binDirs, *cacheDir, nil)

	var mu sync.Mutex
	enc := json.NewEncoder(out)
	failed := 0
	slots := make(chan struct{}, *concurrency)
	var wg sync.WaitGroup
	t0 := time.Now()
	ms := func() float64 { return float64(time.Since(t0).Microseconds()) / 1000 }
	last := 0.0
	for i, r := range reqs {
		slots <- struct{}{}
		wg.Add(1)
		go func(i int, r batchRequest) {
			defer func() { <-slots; wg.Done() }()
			a := batchAnswer{I: i, StartMs: ms()}
			res, err := batchCall(cni, list, r, *timeout)
			if err != nil {
				a.Error = err.Error()
			}
			a.Result = res
			a.EndMs = ms()
			mu.Lock()
			defer mu.Unlock()
			if a.Error != "" {
				failed++
			}
			if a.EndMs > last {
				last = a.EndMs
			}
			_ = enc.Encode(a)
		}(i, r)
	}
	wg.Wait()
	if err := enc.Encode(map[string]float64{"wallMs": last}); err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d requests failed", failed, len(reqs))
	}
	return nil
}

func batchCall(cni *libcni.CNIConfig, list *libcni.NetworkConfigList, r batchRequest, timeout time.Duration) (json.RawMessage, error) {
	args, err := parseCniArgs(r.Args)
	if err != nil {
		return nil, fmt.Errorf("args: %w", err)
	}
	rt := &libcni.RuntimeConf{ContainerID: r.ContainerID, NetNS: r.Netns, IfName: r.IfName, Args: args, CapabilityArgs: r.RuntimeConfig}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if r.Cmd == "add" {
		res, err := cni.AddNetworkList(ctx, list, rt)
		if err != nil {
			return nil, fmt.Errorf("add network list %q: %w", list.Name, err)
		}
		var buf bytes.Buffer
		if err := res.PrintTo(&buf); err != nil {
			return nil, fmt.Errorf("add network list %q: printing the result: %w", list.Name, err)
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, buf.Bytes()); err != nil {
			return nil, fmt.Errorf("add network list %q: result is not JSON: %w", list.Name, err)
		}
		return compact.Bytes(), nil
	}
	if err := cni.DelNetworkList(ctx, list, rt); err != nil {
		return nil, fmt.Errorf("del network list %q: %w", list.Name, err)
	}
	return nil, nil
}
