package testserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisClusterEnv names an existing Redis Cluster for [RedisCluster] to use
// instead of starting one: the host:port of some of its nodes, separated by
// commas.
const RedisClusterEnv = "CONTEND_REDIS_CLUSTER_ADDRS"

// RedisCluster returns a client of a Redis Cluster, closed when t ends: the
// one [RedisClusterEnv] names, or else one of masters nodes (no replicas)
// started once for the whole test binary and stopped by [StopAll]. Starting
// a cluster takes longer than most tests that use one. The started cluster
// is named in [RedisClusterEnv] too, so that the worker processes a test
// starts use it rather than start their own: a test whose workers use the
// cluster calls RedisCluster before it starts them. The cluster is shared
// with whatever else uses it: tests keep their keys under a prefix of their
// own ([ClusterPrefix]). A test that stops nodes starts a cluster of its own
// with [StartCluster].
func RedisCluster(t testing.TB, masters int) *redis.ClusterClient {
	t.Helper()
	addrs, err := sharedCluster(masters)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(addrs, ",")})
	t.Cleanup(func() { c.Close() })
	if err := c.ForEachMaster(context.Background(), func(ctx context.Context, n *redis.Client) error { return n.Ping(ctx).Err() }); err != nil {
		t.Fatalf("testserver: redis cluster at %s=%s: %v", RedisClusterEnv, addrs, err)
	}
	return c
}

// clusterMu serialises the start of the shared cluster, so that tests that
// ask for it at once wait for the one being started; mu is not held
// meanwhile, for the tests that only want a schema.
var clusterMu sync.Mutex

// sharedCluster returns the addresses in [RedisClusterEnv], starting a
// cluster of masters nodes and setting the variable when it is unset.
func sharedCluster(masters int) (string, error) {
	clusterMu.Lock()
	defer clusterMu.Unlock()
	if addrs := os.Getenv(RedisClusterEnv); addrs != "" {
		return addrs, nil
	}
	var nodes []*owned
	stop := func() error {
		var errs []error
		for _, n := range nodes {
			errs = append(errs, n.remove())
		}
		return errors.Join(errs...)
	}
	addrs, err := formCluster(ClusterOptions{Masters: masters}, func(args ...string) (string, error) {
		d, err := newRedisDaemon(args...)
		if err != nil {
			return "", err
		}
		n := &owned{d: d}
		nodes = append(nodes, n) // its directory is removed by stop on failure too
		if err := n.startOnFreePort(); err != nil {
			return "", err
		}
		return n.Addr(), nil
	})
	if err != nil {
		return "", errors.Join(fmt.Errorf("testserver: start a redis cluster: %w", err), stop())
	}
	joined := strings.Join(addrs, ",")
	mu.Lock()
	defer mu.Unlock()
	stops = append(stops, stop)
	if err := os.Setenv(RedisClusterEnv, joined); err != nil {
		return "", err
	}
	exported = append(exported, RedisClusterEnv)
	return joined, nil
}

// ClusterPrefix returns a key prefix no other test uses on the cluster c;
// the keys under it are deleted, on every master, when t ends.
func ClusterPrefix(t testing.TB, c *redis.ClusterClient) string {
	t.Helper()
	prefix := RandomName("contend:test:") + ":"
	t.Cleanup(func() {
		err := c.ForEachMaster(context.Background(), func(ctx context.Context, node *redis.Client) error {
			keys, err := node.Keys(ctx, prefix+"*").Result()
			if err != nil {
				return err
			}
			// One key per command: a node refuses keys of several slots
			// in one.
			pipe := node.Pipeline()
			for _, k := range keys {
				pipe.Unlink(ctx, k)
			}
			_, err = pipe.Exec(ctx)
			return err
		})
		if err != nil {
			t.Errorf("testserver: clean redis cluster prefix %s: %v", prefix, err)
		}
	})
	return prefix
}

// ClusterOptions says what Redis Cluster [StartCluster] makes.
type ClusterOptions struct {
	// Masters is how many masters share the slots; three is the least
	// redis-cli creates.
	Masters int
	// Replicas is how many replicas each master has. Default: none.
	Replicas int
	// NodeTimeout is the cluster-node-timeout: how long a node may be
	// unreachable before it counts as failed and a replica takes its
	// place. Default: 5s. A failover test wants it short; on a loaded
	// machine a short one may fail a node over that was only slow.
	NodeTimeout time.Duration
}

// A Cluster is a Redis Cluster that belongs to one test: its nodes may be
// stopped, to fail a master over to its replica.
type Cluster struct {
	// Client is a client of the whole cluster, closed when the test ends.
	Client *redis.ClusterClient
	// Nodes are the cluster's servers, masters and replicas alike.
	Nodes []*OwnedRedis
}

// Node returns the node listening at addr (host:port), or nil.
func (c *Cluster) Node(addr string) *OwnedRedis {
	for _, n := range c.Nodes {
		if n.Addr() == addr {
			return n
		}
	}
	return nil
}

// StartCluster starts a Redis Cluster for t alone, from the locally
// installed redis-server and redis-cli, and waits until every node says
// the cluster is ok and every replica has synchronised with its master.
// The nodes are stopped and their directories removed when t ends. It
// fails t when the cluster does not come up.
func StartCluster(t testing.TB, o ClusterOptions) *Cluster {
	t.Helper()
	cl := &Cluster{}
	addrs, err := formCluster(o, func(args ...string) (string, error) {
		node := ownRedis(t, args...)
		cl.Nodes = append(cl.Nodes, node)
		return node.Addr(), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	cl.Client = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { cl.Client.Close() })
	cl.Client.ReloadState(context.Background())
	return cl
}

// formCluster starts the nodes of a cluster of o with start, which runs
// redis-server with the arguments given after its own and returns the
// node's address; then it joins them into a cluster and waits until every
// node says the cluster is ok and every replica has synchronised with its
// master. It returns the nodes' addresses.
func formCluster(o ClusterOptions, start func(args ...string) (string, error)) ([]string, error) {
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return nil, fmt.Errorf("testserver: redis-cli not found (Debian: apt-get install redis-tools): %w", err)
	}
	if o.NodeTimeout <= 0 {
		o.NodeTimeout = 5 * time.Second
	}
	var addrs []string
	for range o.Masters * (1 + o.Replicas) {
		// The cluster bus listens on a port of its own; the default, the
		// node's port + 10000, may be past 65535 for a free port.
		bus, err := freePort()
		if err != nil {
			return nil, err
		}
		// A master sends a replica its first copy only after waiting
		// repl-diskless-sync-delay (5s by default) for more replicas to
		// share it; every replica comes up at once here.
		addr, err := start("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-port", strconv.Itoa(bus),
			"--cluster-node-timeout", strconv.FormatInt(o.NodeTimeout.Milliseconds(), 10),
			"--repl-diskless-sync-delay", "0")
		if err != nil {
			return nil, err
		}
		addrs = append(addrs, addr)
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(o.Replicas), "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("testserver: redis-cli --cluster create: %w\n%s", err, out)
	}
	// Every node must agree that all slots are served before a client can
	// rely on its view of the cluster.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, addr := range addrs {
		if err := clusterOK(ctx, addr); err != nil {
			return nil, fmt.Errorf("testserver: redis cluster node %s: %w", addr, err)
		}
	}
	for _, addr := range addrs {
		if err := synced(ctx, addr); err != nil {
			return nil, fmt.Errorf("testserver: redis cluster: %w", err)
		}
	}
	return addrs, nil
}

// synced waits until node answers and, if it is a replica, its link to its
// master is up: a replica still loading its first copy cannot take over.
func synced(ctx context.Context, addr string) error {
	node := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer node.Close()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		info, err := node.Info(ctx, "replication").Result()
		if err == nil && (strings.Contains(info, "role:master") || strings.Contains(info, "master_link_status:up")) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not in sync (last: %v): %w", addr, err, ctx.Err())
		case <-tick.C:
		}
	}
}

// clusterOK waits until the node at addr reports cluster_state:ok, or ctx
// ends.
func clusterOK(ctx context.Context, addr string) error {
	node := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer node.Close()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		info, err := node.ClusterInfo(ctx).Result()
		if err == nil && strings.Contains(info, "cluster_state:ok") {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster_state not ok (last: %v): %w", err, ctx.Err())
		case <-tick.C:
		}
	}
}
