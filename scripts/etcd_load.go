// etcd_load: etcd's put benchmark, the way etcd's own tools/benchmark drives it (clientv3, a fixed
// number of gRPC connections shared round-robin by CLIENTS goroutines, each with one Put in
// flight), built from Debian's golang-etcd-server-dev because the benchmark tool itself is not
// packaged. Prints one JSON line like scripts/redis_load.c and scripts/hasvc_load.c.
//
//	etcd_load ENDPOINTS CONNS CLIENTS SECONDS SIZE
//
// ENDPOINTS is comma-separated; a Put is acknowledged by etcd once a quorum has the entry in its
// WAL (fsynced unless the members run with --unsafe-no-fsync) and the leader applied it.
package main

import (
	"context"
	"fmt"
	"math/rand"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/clientv3"
)

func main() {
	if len(os.Args) != 6 {
		fmt.Fprintln(os.Stderr, "usage: etcd_load ENDPOINTS CONNS CLIENTS SECONDS SIZE")
		os.Exit(2)
	}
	endpoints := strings.Split(os.Args[1], ",")
	conns, _ := strconv.Atoi(os.Args[2])
	clients, _ := strconv.Atoi(os.Args[3])
	seconds, _ := strconv.ParseFloat(os.Args[4], 64)
	size, _ := strconv.Atoi(os.Args[5])
	if conns < 1 || clients < 1 || seconds <= 0 || size < 0 {
		fmt.Fprintln(os.Stderr, "etcd_load: need CONNS >= 1, CLIENTS >= 1, SECONDS > 0, SIZE >= 0")
		os.Exit(2)
	}
	pool := make([]*clientv3.Client, conns)
	for i := range pool {
		c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 10 * time.Second})
		if err != nil {
			fmt.Fprintln(os.Stderr, "etcd_load: connect:", err)
			os.Exit(1)
		}
		defer c.Close()
		pool[i] = c
	}
	value := strings.Repeat("v", size)
	// Warm up: every connection has found the leader before the clock starts.
	for _, c := range pool {
		if _, err := c.Put(context.Background(), "warmup", value); err != nil {
			fmt.Fprintln(os.Stderr, "etcd_load: warm-up put:", err)
			os.Exit(1)
		}
	}
	var mu sync.Mutex
	var latencies []float64
	failed := 0
	start := time.Now()
	deadline := start.Add(time.Duration(seconds * float64(time.Second)))
	var wg sync.WaitGroup
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			c := pool[i%conns]
			r := rand.New(rand.NewSource(int64(i)))
			own := make([]float64, 0, 4096)
			bad := 0
			for time.Now().Before(deadline) {
				key := fmt.Sprintf("k%08d", r.Intn(100000))
				t := time.Now()
				_, err := c.Put(context.Background(), key, value)
				if err != nil {
					bad++
					continue
				}
				own = append(own, float64(time.Since(t).Microseconds()))
			}
			mu.Lock()
			latencies = append(latencies, own...)
			failed += bad
			mu.Unlock()
		}(i)
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	sort.Float64s(latencies)
	pct := func(q float64) float64 {
		if len(latencies) == 0 {
			return 0
		}
		return latencies[int(q*float64(len(latencies)-1)+0.5)]
	}
	fmt.Printf("{\"acked\": %d, \"failed\": %d, \"seconds\": %.6f, \"p50_us\": %.1f, \"p99_us\": %.1f}\n",
		len(latencies), failed, elapsed, pct(0.5), pct(0.99))
}
