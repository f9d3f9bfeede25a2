package usage

import "time"

// OverUse decides when a container above its slice is reported: once it has
// been over, in every sample, for Grace, and again every Repeat while it
// stays over. A sample in which it is not over (or it is gone) starts it
// afresh. The zero value is not usable; use NewOverUse.
type OverUse struct {
	grace, repeat time.Duration
	over          map[key]*overState
}

// overState is one container's current stretch above its slice.
type overState struct {
	since    time.Time // first sample of the stretch
	reported time.Time // last report; zero before the first
}

// Report is a container to report now.
type Report struct {
	ContainerUse
	// Since is when the current stretch above its slice began.
	Since time.Time
}

// NewOverUse returns a tracker reporting after grace, then every repeat.
func NewOverUse(grace, repeat time.Duration) *OverUse {
	return &OverUse{grace: grace, repeat: repeat, over: map[key]*overState{}}
}

// Observe takes the sample read at now and returns the containers to report.
func (o *OverUse) Observe(now time.Time, s Sample) []Report {
	seen := map[key]bool{}
	var out []Report
	for _, c := range s.Containers {
		if !c.Over() {
			continue
		}
		k := c.key()
		seen[k] = true
		st := o.over[k]
		if st == nil {
			st = &overState{since: now}
			o.over[k] = st
		}
		due := now.Sub(st.since) >= o.grace && (st.reported.IsZero() || now.Sub(st.reported) >= o.repeat)
		if due {
			st.reported = now
			out = append(out, Report{ContainerUse: c, Since: st.since})
		}
	}
	for k := range o.over {
		if !seen[k] {
			delete(o.over, k)
		}
	}
	return out
}

// Over counts the containers above their slice now, whether reported yet or not.
func (o *OverUse) Over() int { return len(o.over) }
