# A database's first event subscription is served at once, whatever the
# upkeep worker was doing when it was created.
#
# The upkeep worker notes when a database has no event subscription, so that
# commits that publish there (an application server whose events are
# delivered elsewhere) wake no delivery worker; a subscription created since
# clears the note. It read the subscriptions with the snapshot its unit of
# work began with, and the note's guard (no subscription created since) after
# the unit's other statements: a subscription created in between was noted
# as absent, the events published next woke nobody, and they waited for a
# delivery worker's next look of its own (up to a minute; test 004 failed so
# twice in about 25 runs of the suite). Reproduced here step by step: the
# upkeep's unit is held on a table lock after it began, the subscription is
# created meanwhile, and the event published once the unit ended must
# arrive within 10 s.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = new_node('first_subscription');
my $r = start_receiver();
my $u = $r->{url};
sub sql { return $node->safe_psql('postgres', shift) }

sql("SELECT eventgrid.create_topic('other')");
sql("SELECT eventgrid.create_topic('shop')");

# the database has no subscription, and the upkeep worker has noted it
sql("INSERT INTO eventgrid.events (topic, event) VALUES ('other', '" . eg_event('o-1') . "')");
ok(wait_for_sql($node, "SELECT published FROM eventgrid.topic_counters WHERE topic = 'other'", '1', 30),
	'the upkeep worker counted the first event (and looked for subscriptions)');

# hold the table the upkeep worker's unit cleans up last, before it looks for subscriptions
my $holder = $node->background_psql('postgres');
$holder->query_safe("BEGIN; LOCK TABLE eventgrid.endpoint_states IN SHARE MODE;");
# an event of 'other' wakes the upkeep worker: its unit of work begins, then waits for the table
sql("INSERT INTO eventgrid.events (topic, event) VALUES ('other', '" . eg_event('o-2') . "')");
ok(wait_for_sql($node, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'eventgrid upkeep worker'"
	  . " AND wait_event_type = 'Lock'", '1', 8),
	'the upkeep worker\'s unit of work waits for the table');

# the first subscription, created while that unit runs
sql("SELECT eventgrid.create_event_subscription('shop', 'first', '$u/status/200/first')");
$holder->query_safe('COMMIT');
$holder->quit;
ok(wait_for_sql($node, "SELECT published FROM eventgrid.topic_counters WHERE topic = 'other'", '2', 30),
	'the unit went on and ended');

sql("INSERT INTO eventgrid.events (topic, event) VALUES ('shop', '" . eg_event('s-1') . "')");
my @got = wait_for_requests($r, '/status/200/first', 1, 10);
is(scalar(@got), 1, 'the event published next is delivered within 10 s: its commit woke a delivery worker');

$node->stop;
done_testing();
