# PGXS build for the eventgrid extension.
#   make && sudo make install      build and install against pg_config on PATH
#   make installcheck              pg_regress suite (own temporary instance)
#                                  plus the TAP integration tests in test/t
MODULE_big = eventgrid
OBJS = src/module.o src/launcher.o src/worker.o src/delivery_worker.o src/delivery_claim.o \
       src/delivery_record.o src/upkeep_worker.o src/outcome.o src/publish.o src/filter.o \
       src/request.o src/http.o src/url.o src/endpoint_queue.o src/endpoint_health.o \
       src/store.o src/store_claim.o src/store_claim_retries.o src/store_record.o src/store_recovery.o src/store_rotation.o \
       src/store_counts.o src/store_health.o src/signing.o src/rate.o src/validation.o src/store_validation.o \
       src/table_change.o src/databases.o src/store_metrics.o src/table_change_trigger.o src/replication.o

EXTENSION = eventgrid
# the full script of the current version (scripts/install-script.sh makes it), the
# full scripts of 0.1.0 and 0.2.0 that installations were made from, and the upgrades
DATA = $(wildcard $(srcdir)/sql/eventgrid--*.sql)
PGFILEDESC = "eventgrid - Event Grid push delivery for PostgreSQL"

REGRESS = config publish retry filters pending security
REGRESS_OPTS = --temp-config=$(srcdir)/test/regress.conf --temp-instance=./tmp_check

TAP_TESTS = 1
PROVE_TESTS = test/t/*.pl

EG_VERSION = $(shell sed -n "s/^default_version = '\(.*\)'/\1/p" $(srcdir)/eventgrid.control)

SHLIB_LINK += $(shell curl-config --libs) -pthread
PG_CPPFLAGS += $(shell curl-config --cflags) -I$(srcdir)/src -DEG_VERSION='"$(EG_VERSION)"'
PG_CFLAGS += -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -Werror

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# after PGXS, which sets PROVE_FLAGS itself: each test file has its own
# clusters and receivers, so three run at a time
PROVE_FLAGS = -I $(srcdir)/test/lib -j3

# every C file includes the shared headers: rebuild them all when one changes
$(OBJS): $(wildcard $(srcdir)/src/*.h)
# and those that compile in EG_VERSION when the version changes
src/http.o src/store.o src/delivery_worker.o: eventgrid.control
