package manager

import (
	"errors"
	"testing"

	"github.com/gpushare/gpushare/plugin/inventory"
)

// A plugin without a recorder (an allocator built in a test, a Manager
// before Run) records nothing and does not fail.
func TestNilNodeEventsRecordNothing(t *testing.T) {
	var e *nodeEvents
	e.allocateRefused([]uint64{4}, errors.New("refused"))
	e.healthChanged(&inventory.Inventory{}, &inventory.Inventory{})
	newNodeEvents(nil, "n1").allocateRefused([]uint64{4}, errors.New("refused"))
}
