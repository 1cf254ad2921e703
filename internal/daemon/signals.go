package daemon

import (
	"os"
	"os/signal"
	"sync"
	"syscall"

	"go.uber.org/zap"
)

// reloader is one thing SIGHUP re-reads.
type reloader struct {
	name   string
	reload func()
}

// OnReload registers what SIGHUP re-reads (the token file, say). Call it
// before Run. On each SIGHUP the reloads run one after the other, in the
// order registered, on one goroutine; each logs its own outcome and keeps
// what is in force when the new input is bad.
func (s *Server) OnReload(name string, reload func()) {
	s.reloaders = append(s.reloaders, reloader{name: name, reload: reload})
}

// handleHangup takes SIGHUP for the whole of Run, whether or not anything
// registered a reload. Untaken, SIGHUP kills a Go process, and systemd
// counts a death by SIGHUP as a clean exit: `systemctl reload` would stop
// the daemon for good, Restart=on-failure never firing. The returned
// function stops taking it; Run calls it on its way out.
func (s *Server) handleHangup() (stop func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			case <-hup:
				s.reload()
			}
		}
	}()
	return func() {
		signal.Stop(hup)
		close(done)
		wg.Wait()
	}
}

func (s *Server) reload() {
	if len(s.reloaders) == 0 {
		s.log.Info("reload: nothing to reload", zap.String("signal", "SIGHUP"))
		return
	}
	for _, r := range s.reloaders {
		s.log.Info("reloading", zap.String("signal", "SIGHUP"), zap.String("what", r.name))
		r.reload()
	}
}
