# PGXS build for the eventgrid extension.
#   make && sudo make install      build and install against pg_config on PATH
#   make installcheck              pg_regress suite (own temporary instance)
#                                  plus the TAP integration tests in test/t
MODULE_big = eventgrid
OBJS = src/eventgrid.o src/launcher.o src/publish.o src/retry.o src/payload.o src/request.o src/queue.o \
       src/http.o src/endpoint.o src/filter.o src/worker.o

EXTENSION = eventgrid
DATA = sql/eventgrid--0.1.0.sql sql/eventgrid--0.2.0.sql sql/eventgrid--0.1.0--0.2.0.sql \
       sql/eventgrid--0.2.0--0.3.0.sql sql/eventgrid--0.3.0--0.4.0.sql sql/eventgrid--0.4.0--0.5.0.sql \
       sql/eventgrid--0.5.0--0.6.0.sql
PGFILEDESC = "eventgrid - Event Grid push delivery for PostgreSQL"

REGRESS = config publish retry filters pending security
REGRESS_OPTS = --temp-config=$(srcdir)/test/regress.conf --temp-instance=./tmp_check

TAP_TESTS = 1
PROVE_TESTS = test/t/*.pl
PROVE_FLAGS = -I $(srcdir)/test/lib

EG_VERSION = $(shell sed -n "s/^default_version = '\(.*\)'/\1/p" $(srcdir)/eventgrid.control)

SHLIB_LINK += $(shell curl-config --libs) -pthread
PG_CPPFLAGS += $(shell curl-config --cflags) -I$(srcdir)/src -DEG_VERSION='"$(EG_VERSION)"'
PG_CFLAGS += -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers -Werror

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# every C file includes the shared header: rebuild them all when it changes
$(OBJS): src/eventgrid.h
# and those that compile in EG_VERSION when the version changes
src/http.o src/queue.o src/worker.o: eventgrid.control
