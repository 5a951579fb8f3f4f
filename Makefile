# PGXS build for the eventgrid extension.
#   make && sudo make install      build and install against pg_config on PATH
#   make installcheck              pg_regress suite (own temporary instance)
#                                  plus the TAP integration tests in test/t
MODULE_big = eventgrid
# src/ is in folders by concern, each standing only on those below it
# (docs/ARCHITECTURE.md): core < http < store < publish, delivery, queue, serve < src/
OBJS = $(patsubst %.c,%.o,$(sort $(wildcard $(srcdir)/src/core/*.c))) \
       $(patsubst %.c,%.o,$(sort $(wildcard $(srcdir)/src/http/*.c))) \
       $(patsubst %.c,%.o,$(sort $(wildcard $(srcdir)/src/store/*.c))) \
       $(patsubst %.c,%.o,$(sort $(wildcard $(srcdir)/src/publish/*.c))) \
       $(patsubst %.c,%.o,$(sort $(wildcard $(srcdir)/src/delivery/*.c))) \
       $(patsubst %.c,%.o,$(sort $(wildcard $(srcdir)/src/queue/*.c))) \
       $(patsubst %.c,%.o,$(sort $(wildcard $(srcdir)/src/serve/*.c))) \
       $(patsubst %.c,%.o,$(sort $(wildcard $(srcdir)/src/*.c)))

EXTENSION = eventgrid
# the full script of the current version (scripts/install-script.sh makes it),
# the older full scripts that tests install (0.1.0, 0.7.0, 0.8.0: see
# docs/ARCHITECTURE.md), and every upgrade
DATA = $(wildcard $(srcdir)/sql/eventgrid--*.sql)
PGFILEDESC = "eventgrid - Event Grid push delivery for PostgreSQL"

REGRESS = config publish retry filters pending security
REGRESS_OPTS = --temp-config=$(srcdir)/test/regress.conf --temp-instance=./tmp_check

TAP_TESTS = 1
# the longest files first (prove -j starts them in this order): run last,
# one was the suite's tail alone for a minute and a half.  Measured with
# prove --timer on the 2-core machine, 90-180 s each; prove runs in
# $(srcdir), the paths are relative to it
EG_SLOW_TESTS = $(addprefix test/t/,053_bearer_tokens.pl 055_pull_delivery.pl 038_changes_take_effect.pl \
                054_ordered_delivery.pl 075_scale_in_subscriptions.pl 062_http_publish.pl 057_receive_rights.pl \
                010_memory.pl 020_activity_and_logs.pl 039_databases.pl 040_many_databases.pl)
PROVE_TESTS = $(EG_SLOW_TESTS) \
              $(filter-out $(EG_SLOW_TESTS),$(patsubst $(srcdir)/%,%,$(sort $(wildcard $(srcdir)/test/t/*.pl))))

EG_VERSION = $(shell sed -n "s/^default_version = '\(.*\)'/\1/p" $(srcdir)/eventgrid.control)

# libcurl (delivery), hiredis (RedisStream destinations), librabbitmq
# (RabbitMQ destinations), OpenSSL's libssl and libcrypto, libmicrohttpd
# (the HTTP listener) and libpq (the listener's connections to the databases)
SHLIB_LINK += $(shell curl-config --libs) -lhiredis -lrabbitmq -lssl -lcrypto -lmicrohttpd -lpq -pthread
# rediss:// (Redis over TLS) where hiredis has TLS (1.0 and later: Debian 13
# and later; Debian 12's hiredis 0.14 has none, and refuses rediss:// URLs)
ifneq ($(wildcard /usr/include/hiredis/hiredis_ssl.h),)
SHLIB_LINK += -lhiredis_ssl
PG_CPPFLAGS += -DEG_HAVE_REDIS_TLS
endif
PG_CPPFLAGS += $(shell curl-config --cflags) -I$(libpq_srcdir) -I$(srcdir)/src -DEG_VERSION='"$(EG_VERSION)"'
PG_CFLAGS += -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers
# warnings are errors for us (scripts/test.sh, CI: make WERROR=1), never in a
# user's or a packager's build, where the next compiler may warn anew
ifeq ($(WERROR),1)
PG_CFLAGS += -Werror
endif

PG_CONFIG ?= pg_config
# A Debian package build (dpkg-buildpackage sets DEB_HOST_ARCH) makes no
# JIT bitcode (debian/rules says why): pg_buildext drops the MAKEVARS that
# debian/rules exports, so the Makefile says it itself, before PGXS's
# Makefile.global sets with_llvm.
ifdef DEB_HOST_ARCH
override with_llvm = no
endif
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# after PGXS, which sets PROVE_FLAGS itself: each test file has its own
# clusters and receivers, so three run at a time (five took 914 s where
# three took 980-1,070 on the 2-core machine: its servers keep it busy)
PROVE_FLAGS = -I $(srcdir)/test/lib -j3

# every C file includes the shared headers: rebuild them all when one changes
$(OBJS): $(wildcard $(srcdir)/src/*.h $(srcdir)/src/*/*.h)
# and those that compile in EG_VERSION when the version changes
src/http/http.o src/store/store.o src/delivery/delivery_worker.o: eventgrid.control
