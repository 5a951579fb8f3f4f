# The full install script of the current version and the upgrade chain give
# the same extension: CREATE EXTENSION eventgrid (one script) in one
# database, CREATE EXTENSION eventgrid VERSION '0.1.0' and ALTER EXTENSION
# eventgrid UPDATE (the oldest script and every upgrade) in another.
# Compared: the extension's member objects, the tables pg_dump copies
# (pg_extension_config_dump; tables an upgrade dropped stay in that list as
# bare OIDs, which pg_dump passes over), the rows the scripts insert, and the whole
# schema with its privileges and comments as pg_dump --schema-only prints
# it once the objects are released from the extension.  The comparison is
# shown to catch a drift: a third, upgraded database with one comment and
# one privilege changed must differ.
#
# The library is not preloaded here: preloaded, CREATE EXTENSION is refused
# outside eventgrid.database_name.
use strict;
use warnings;
use FindBin;
use lib "$FindBin::RealBin/../lib";
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;

my $node = PostgreSQL::Test::Cluster->new('install_script');
$node->init;
$node->start;

sub sql { my ($db, $q) = @_; return $node->safe_psql($db, $q) }

my ($version) = slurp_file("$FindBin::RealBin/../../eventgrid.control") =~ /^default_version = '([^']+)'/m;
for my $db (qw(fresh upgraded drifted))
{
	sql('postgres', "CREATE DATABASE $db");
}
sql('fresh', 'SET client_min_messages = error; CREATE EXTENSION eventgrid');
for my $db (qw(upgraded drifted))
{
	sql($db, "SET client_min_messages = error; CREATE EXTENSION eventgrid VERSION '0.1.0'");
	sql($db, 'ALTER EXTENSION eventgrid UPDATE');
}
is(sql($_, "SELECT extversion FROM pg_extension WHERE extname = 'eventgrid'"), $version, "$_: version $version")
  for qw(fresh upgraded);

# a drift an upgrade script could bring: a comment and a privilege
sql('drifted', "COMMENT ON FUNCTION eventgrid.retry_delay(integer, integer, text) IS 'drifted'");
sql('drifted', 'GRANT SELECT ON eventgrid.topics TO eventgrid_publisher');

# What one installation holds, as text: members, config tables, initial rows, then the dump.
sub describe
{
	my ($db) = @_;
	my $members = sql($db, q{
		SELECT string_agg(o.type || ' ' || o.identity, E'\n' ORDER BY o.type, o.identity)
		  FROM pg_depend d, LATERAL pg_identify_object(d.classid, d.objid, d.objsubid) o
		 WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e'
		   AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'eventgrid')});
	my $config = sql($db, q{
		SELECT string_agg(c::regclass::text || ' ' || w, E'\n' ORDER BY c::regclass::text)
		  FROM pg_extension e, unnest(e.extconfig, e.extcondition) AS x(c, w)
		 WHERE e.extname = 'eventgrid' AND EXISTS (SELECT 1 FROM pg_class r WHERE r.oid = x.c AND r.relnamespace = 'eventgrid'::regnamespace)});
	my $rows = sql($db, q{
		SELECT (SELECT string_agg(format('%s %s %s', event_table, truncated_at IS NULL, last_failure), ', '
		                          ORDER BY event_table) FROM eventgrid.event_table_rotations)
		       || ' / ' ||
		       (SELECT string_agg(format('%s %s', history_table, first_id), ', ') FROM eventgrid.attempt_log_rotation)});

	# released from the extension (and their initial privileges forgotten),
	# the objects are dumped with every GRANT, REVOKE and COMMENT; types
	# last, each only if still a member (17 releases a table's row type and
	# a composite type's array type with it, 15 does not)
	sql($db, q{
		DO $$
		DECLARE
			ext oid := (SELECT oid FROM pg_extension WHERE extname = 'eventgrid');
			r record;
		BEGIN
			FOR r IN SELECT d.classid, d.objid, d.objsubid, o.type, o.identity
			           FROM pg_depend d, LATERAL pg_identify_object(d.classid, d.objid, d.objsubid) o
			          WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e' AND d.refobjid = ext
			          ORDER BY o.type = 'type', o.identity LIKE '%[]', o.type, o.identity
			LOOP
				IF EXISTS (SELECT FROM pg_depend d
				            WHERE d.classid = r.classid AND d.objid = r.objid AND d.objsubid = r.objsubid
				              AND d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e' AND d.refobjid = ext)
				THEN
					EXECUTE format('ALTER EXTENSION eventgrid DROP %s %s', r.type, r.identity);
				END IF;
			END LOOP;
		END $$});
	sql($db, "DELETE FROM pg_init_privs WHERE privtype = 'e'");
	my $dump = run_dump($db);
	return ("== members\n$members\n== config\n$config\n== rows\n$rows\n", $dump);
}

sub run_dump
{
	my ($db) = @_;
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'pg_dump', '--schema-only', '--schema=eventgrid', '--no-owner', '-d', $node->connstr($db) ],
		'>', \$out, '2>', \$err)
	  or die "pg_dump $db failed: $err";
	$out =~ s/^-- Dumped (from|by) .*\n//mg;
	$out =~ s/^\\(un)?restrict .*\n//mg;	# a random key per dump
	# 18 names NOT NULL constraints, and a child table's take the parent's
	# name or its own by how the table came to inherit (created so or
	# attached later): the same constraint either way
	$out =~ s/ CONSTRAINT \w+_not_null NOT NULL/ NOT NULL/g;
	return $out;
}

# the lines of $a not in $b and of $b not in $a, for a readable failure
sub difference
{
	my ($x, $y) = @_;
	my %in_y = map { $_ => 1 } split /\n/, $y;
	my %in_x = map { $_ => 1 } split /\n/, $x;
	return join("\n", (map { "- $_" } grep { !$in_y{$_} } split /\n/, $x),
		(map { "+ $_" } grep { !$in_x{$_} } split /\n/, $y));
}

my ($fresh_meta, $fresh_dump) = describe('fresh');
my ($upgraded_meta, $upgraded_dump) = describe('upgraded');
my ($drifted_meta, $drifted_dump) = describe('drifted');

like($fresh_meta, qr/function eventgrid\.publish\(/, 'the member list is read');
like($fresh_dump, qr/CREATE TABLE eventgrid\.events_0/, 'the released objects are dumped');
is($fresh_meta, $upgraded_meta, 'same members, config tables and initial rows')
  or diag(difference($fresh_meta, $upgraded_meta));
is($fresh_dump, $upgraded_dump, 'same schema, privileges and comments (pg_dump --schema-only)')
  or diag(difference($fresh_dump, $upgraded_dump));
isnt($drifted_dump, $upgraded_dump, 'a drifted comment and privilege are caught');
like(difference($upgraded_dump, $drifted_dump), qr/drifted/, 'the difference names the drifted comment');
like(difference($upgraded_dump, $drifted_dump), qr/GRANT SELECT ON TABLE eventgrid\.topics TO eventgrid_publisher/,
	'and the drifted privilege');

$node->stop;
done_testing();
