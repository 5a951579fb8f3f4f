# A database's delivery workers leave for DDL that needs the database to
# itself only when that DDL will run (issue "Trust, third pass", item 1):
#  - a login role without the right (not the owner, no CREATEDB) runs DROP
#    DATABASE, ALTER DATABASE ... RENAME TO and CREATE DATABASE ... TEMPLATE
#    of a delivering database, in a transaction block behind a savepoint,
#    rolls back to the savepoint and keeps the transaction open: the
#    database's workers never leave (same pids), served_databases shows no
#    hold, and events published meanwhile are delivered;
#  - the same statements outside a transaction block: refused, no hold;
#  - the owner's own failed DDL (a rename to a name that is taken) releases
#    at once, though the owner's transaction stays open;
#  - the owner's DROP DATABASE, rename and template clone still succeed
#    within about 5 s while the database delivers.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use EventGridTest;
use JSON::PP;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

my $node = new_node('ddl_holds');
my $r = start_receiver();
my $u = $r->{url};
my $json = JSON::PP->new;

sub sql { my ($db, $q) = @_; return $node->safe_psql($db, $q) }

sub worker_pids
{
	my ($db) = @_;
	return sql('postgres', "SELECT string_agg(pid::text, ',' ORDER BY pid) FROM pg_stat_activity WHERE datname = '$db'"
		  . " AND backend_type IN ('eventgrid delivery worker', 'eventgrid upkeep worker')");
}

sub held_by
{
	my ($db) = @_;
	return sql('postgres', "SELECT coalesce(held_by::text, 'none') FROM eventgrid.served_databases WHERE database = '$db'");
}

my $seq = 0;
# publishes one event into $db and returns whether it arrived within $secs
sub delivers
{
	my ($db, $secs) = @_;
	my $id = "$db-" . ++$seq;
	sql($db, "SELECT eventgrid.publish('top', '[" . eg_event($id) . "]')");
	for (1 .. ($secs // 10) * 10)
	{
		return 1 if grep { $json->decode($_->{body})->[0]{id} eq $id } requests($r, "/status/200/$db");
		usleep(100_000);
	}
	return 0;
}

sql('postgres', 'CREATE ROLE mallory LOGIN; CREATE ROLE keeper LOGIN CREATEDB');
sql('postgres', 'CREATE DATABASE victim OWNER keeper');
sql('victim', 'CREATE EXTENSION eventgrid');
sql('victim', "SELECT eventgrid.create_topic('top')");
sql('victim', "SELECT eventgrid.create_event_subscription('top', 'sub', '$u/status/200/victim')");
ok(delivers('victim', 15), 'victim delivers');
ok(start_workers($node, 'victim'), 'its workers run');
my $pids = worker_pids('victim');

# --- an unprivileged role's refused DDL in a transaction block, kept open
my $m = $node->background_psql('postgres', on_error_stop => 0, extra_params => [ '-U', 'mallory' ]);
for my $ddl ('ALTER DATABASE victim RENAME TO x', 'DROP DATABASE victim', 'CREATE DATABASE x TEMPLATE victim')
{
	$m->query("BEGIN; SAVEPOINT s;");
	$m->{stderr} = '';
	$m->query("$ddl;");
	like($m->{stderr}, qr/ERROR/, "mallory's $ddl is refused");
	$m->query("ROLLBACK TO s; SELECT 1;");
	is(held_by('victim'), 'none', "with the transaction still open, nothing holds victim ($ddl)");
	ok(delivers('victim'), "victim delivers meanwhile ($ddl)");
	is(worker_pids('victim'), $pids, "its workers never left ($ddl)");
	$m->query("ROLLBACK;");
}

# the refused statement left in an aborted transaction, not rolled back
$m->query("BEGIN; SAVEPOINT s;");
$m->query("ALTER DATABASE victim RENAME TO x;");
is(held_by('victim'), 'none', 'a transaction left aborted by the refused rename holds nothing');
ok(delivers('victim'), 'victim delivers meanwhile');
$m->query("ROLLBACK;");

# --- outside a transaction block
for my $ddl ('ALTER DATABASE victim RENAME TO x', 'DROP DATABASE victim', 'CREATE DATABASE x TEMPLATE victim',
	'ALTER DATABASE victim SET TABLESPACE pg_default')
{
	$m->{stderr} = '';
	$m->query("$ddl;");
	like($m->{stderr}, qr/ERROR/, "mallory's $ddl outside a transaction block is refused");
}
is(worker_pids('victim'), $pids, 'victim\'s workers never left for them');
ok(delivers('victim'), 'and it delivers');
$m->quit;

# --- the owner's failed DDL releases at once, its transaction still open
sql('postgres', 'CREATE DATABASE taken');
my $k = $node->background_psql('postgres', on_error_stop => 0, extra_params => [ '-U', 'keeper' ]);
$k->query("BEGIN; SAVEPOINT s;");
$k->{stderr} = '';
$k->query("ALTER DATABASE victim RENAME TO taken;");
like($k->{stderr}, qr/already exists/, "the owner's rename to a taken name fails");
is(held_by('victim'), 'none', 'the hold ended with the failed statement, the transaction still open');
ok(start_workers($node, 'victim'), 'the workers are back');
ok(delivers('victim'), 'and deliver');
$k->query("ROLLBACK;");
$k->quit;

# --- the owner's DDL still runs while the database delivers
sql('victim', "SELECT eventgrid.create_event_subscription('top', 'slow', '$u/status/200/victim-slow?delay_ms=300')");
sql('victim', "SELECT eventgrid.publish('top', '[" . join(',', map { eg_event("busy-$_") } 1 .. 30) . "]')");
my $t0 = time();
$node->safe_psql('postgres', 'SET ROLE keeper; CREATE DATABASE clone TEMPLATE victim');
cmp_ok(time() - $t0, '<', 6, "the owner's CREATE DATABASE ... TEMPLATE of a delivering database succeeds within about 5 s");
$t0 = time();
$node->safe_psql('postgres', 'SET ROLE keeper; ALTER DATABASE victim RENAME TO victim2');
cmp_ok(time() - $t0, '<', 6, "the owner's rename succeeds within about 5 s");
# served_databases names it victim2 once the launcher has read pg_database again after the rename
ok(wait_for_sql($node, "SELECT coalesce(held_by::text, 'none') FROM eventgrid.served_databases WHERE database = 'victim2'",
		'none', 30), 'and holds nothing after');
$t0 = time();
$node->safe_psql('postgres', 'SET ROLE keeper; DROP DATABASE victim2');
cmp_ok(time() - $t0, '<', 6, "the owner's DROP DATABASE succeeds within about 5 s");
is(sql('postgres', "SELECT count(*) FROM pg_database WHERE datname = 'victim2'"), '0', 'victim2 is gone');

$node->stop;
done_testing();
