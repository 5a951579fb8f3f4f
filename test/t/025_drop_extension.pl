# DROP EXTENSION eventgrid while the workers run: they notice the extension
# is gone and wait quietly for CREATE EXTENSION, as pg_cron's scheduler
# does; no statement of theirs fails with "relation ... does not exist".
#
# Before, a worker that had checked the extension at the start of a unit of
# work went on running statements against the dropped tables: a unit begun
# while DROP EXTENSION had not committed yet saw the extension, waited for
# the drop's locks, and failed.  Now a unit of work locks the extension (in
# the mode DROP EXTENSION's lock conflicts with) and looks again once it
# holds the lock.  The drop is repeated, each time held open for a moment,
# while events are delivered and retried, so that units of work begin
# during it.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = new_node('drop_extension', 'eventgrid.delivery_workers' => 2);
my $r = start_receiver();
my $u = $r->{url};

sub sql { return $node->safe_psql('postgres', shift) }

my $rounds = 6;
for my $round (1 .. $rounds)
{
	sql("SELECT eventgrid.create_topic('drop-me')");
	sql("SELECT eventgrid.create_event_subscription('drop-me', 'ok-$round', '$u/status/200/ok')");
	sql("SELECT eventgrid.create_event_subscription('drop-me', 'failing-$round', '$u/status/503/failing')");
	sql("INSERT INTO eventgrid.events (topic, event) SELECT 'drop-me', jsonb_build_object('id', 'e-' || i,"
		  . " 'subject', '/s', 'eventType', 'T', 'eventTime', '2024-05-01T12:00:00Z')"
		  . " FROM generate_series(1, 500) i");
	wait_for_requests($r, '/status/200/ok', 100 * $round, 20);
	# the drop stays uncommitted a while, holding its locks, as a large
	# one does: units of work the workers begin meanwhile still see the extension
	sql('BEGIN; DROP EXTENSION eventgrid; SELECT pg_sleep(1.5); COMMIT;');
	sql('SELECT pg_sleep(0.3)');
	sql('CREATE EXTENSION eventgrid');
}

# the last round is delivered: the workers came back each time
sql("SELECT eventgrid.create_topic('after')");
sql("SELECT eventgrid.create_event_subscription('after', 'after', '$u/status/200/after')");
sql("INSERT INTO eventgrid.events (topic, event) VALUES ('after', '"
	  . eg_event('after-1') . "')");
ok(wait_for_requests($r, '/status/200/after', 1, 30), 'after the drops, a new event is delivered');

my $log = slurp_file($node->logfile);
my @missing = $log =~ /^.*(?:does not exist|cache lookup failed).*$/mg;
is(scalar(@missing), 0, "no worker statement ran against the dropped extension ($rounds drops)")
  or diag(join("\n", @missing[0 .. ($#missing < 4 ? $#missing : 4)]));
like($log, qr/extension eventgrid was dropped from database "postgres"; its workers leave/,
	'the workers said that the extension was dropped, and left');

$node->stop('immediate');
done_testing();
