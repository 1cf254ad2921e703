package chaos

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"

	"github.com/pdlink/pdlink/internal/testbed"
)

// netFault is a fault a proxy injects on a link for a while, then heals.
type netFault struct {
	name string
	// start injects the fault on p; the returned func heals it.
	start func(t *testing.T, p *toxiproxy.Proxy) (heal func())
}

// toxic adds a toxic on both directions of p and returns its removal.
func toxic(typ, attrs string) func(t *testing.T, p *toxiproxy.Proxy) func() {
	return func(t *testing.T, p *toxiproxy.Proxy) func() {
		var names []string
		for _, stream := range []string{"upstream", "downstream"} {
			name := typ + "_" + stream
			js := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"attributes":%s}`, name, typ, stream, attrs)
			if _, err := p.Toxics.AddToxicJson(strings.NewReader(js)); err != nil {
				t.Errorf("%s: add %s: %v", p.Name, name, err)
				continue
			}
			names = append(names, name)
		}
		return func() {
			for _, n := range names {
				if err := p.Toxics.RemoveToxic(context.Background(), n); err != nil {
					t.Errorf("%s: remove %s: %v", p.Name, n, err)
				}
			}
		}
	}
}

// dropConnections closes every connection through p every 250 ms (the
// listener goes away for a moment each time) until healed.
func dropConnections(t *testing.T, p *toxiproxy.Proxy) func() {
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tk := time.NewTicker(250 * time.Millisecond)
		defer tk.Stop()
		for {
			p.Stop()
			time.Sleep(20 * time.Millisecond)
			if err := p.Start(); err != nil {
				t.Errorf("%s: restart proxy: %v", p.Name, err)
				return
			}
			select {
			case <-stop:
				return
			case <-tk.C:
			}
		}
	}()
	return func() { close(stop); <-done }
}

var netFaults = []netFault{
	// Every byte 100 ms late (+-50 ms), both ways.
	{"delay", toxic("latency", `{"latency":100,"jitter":50}`)},
	// Connections closed and refused again and again.
	{"drop", dropConnections},
	// Every connection reset as soon as data flows.
	{"reset", toxic("reset_peer", `{"timeout":0}`)},
	// Every byte dropped, connections held open; healing closes them.
	{"blackhole", toxic("timeout", `{"timeout":0}`)},
}

// Faults on the links between the daemons, through Toxiproxy: decode's
// control connection to prefill's bootstrap socket and prefill's data
// connections to decode. Each fault starts once rooms are in flight,
// lasts a while, then heals. Every room ends within its bound with its
// bytes right or failed, nothing pins, and after the heal every new room
// succeeds.
func TestNetworkFaultsBetweenDaemonsNeverPinARoom(t *testing.T) {
	links := []string{"control+data"}
	window := 1500 * time.Millisecond
	n, conc := 150, 30
	if *long {
		links = []string{"control", "data", "control+data"}
		window = 4 * time.Second
		n, conc = 600, 100
	}
	for _, f := range netFaults {
		for _, link := range links {
			t.Run(f.name+"/"+link, func(t *testing.T) {
				c := newCluster(t, clusterOpts{proxies: true})
				// Rooms keep coming until a second after the heal, so the
				// fault hits rooms at every stage and the heal too.
				w := c.workload(100000, conc)
				stop := make(chan struct{})
				w.Stop = stop
				faultAt := make(chan struct{})
				var once sync.Once
				w.Progress = func(done, _ int) {
					if done >= n/5 {
						once.Do(func() { close(faultAt) })
					}
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				defer cancel()
				var proxies []*toxiproxy.Proxy
				if strings.Contains(link, "control") {
					proxies = append(proxies, c.ctl)
				}
				if strings.Contains(link, "data") {
					proxies = append(proxies, c.dat)
				}
				faulted := make(chan time.Duration, 1)
				go func() {
					defer close(stop)
					select {
					case <-faultAt:
					case <-ctx.Done():
						faulted <- 0
						return
					}
					start := time.Now()
					var heals []func()
					for _, p := range proxies {
						heals = append(heals, f.start(t, p))
					}
					time.Sleep(window)
					for _, h := range heals {
						h()
					}
					faulted <- time.Since(start)
					time.Sleep(time.Second)
				}()
				rep := c.run(ctx, w)
				lasted := <-faulted
				if lasted == 0 {
					t.Fatal("the fault never started")
				}
				// After the heal, new rooms go through again: every one
				// succeeds (the control session and data connections
				// came back).
				after := c.run(ctx, c.workload(n/3, conc))
				if after.Outcomes["decode:success"] != n/3 || after.Outcomes["prefill:success"] != n/3 {
					t.Errorf("after the heal, not every new room succeeded: %v", after.Outcomes)
				}
				rep = testbed.Merge(rep, after)
				t.Logf("%s on %s for %v", f.name, link, lasted.Round(time.Millisecond))
				c.check(fmt.Sprintf("network %s on %s, %v then heal", f.name, link, window), rep, func(o string) bool {
					side, what, _ := strings.Cut(o, ":")
					if side == "open_error" {
						return false
					}
					return what == "success" || what == "peer_lost" || strings.HasPrefix(what, "timeout:") ||
						what == "aborted:remote" || what == "transfer_error" || knownInvalid(t, o)
				})
			})
		}
	}
}
