package daemon

import "sync"

// Group runs components together: each has an execute function that blocks
// while it serves and an interrupt function that makes execute return. When
// the first execute returns, every interrupt is called, and Run returns that
// first result once all executes have returned.
type Group struct {
	actors []actor
}

type actor struct {
	execute   func() error
	interrupt func(error)
}

// Add appends a component. interrupt may be called before execute starts
// and must be safe to call once execute has returned.
func (g *Group) Add(execute func() error, interrupt func(error)) {
	g.actors = append(g.actors, actor{execute, interrupt})
}

// Run starts every component and blocks until all have returned. It returns
// the error of the first component to return (nil if that was a clean stop).
func (g *Group) Run() error {
	if len(g.actors) == 0 {
		return nil
	}
	errs := make(chan error, len(g.actors))
	for _, a := range g.actors {
		go func(a actor) { errs <- a.execute() }(a)
	}
	first := <-errs
	var once sync.Once
	once.Do(func() {
		for _, a := range g.actors {
			a.interrupt(first)
		}
	})
	for i := 1; i < len(g.actors); i++ {
		<-errs
	}
	return first
}
