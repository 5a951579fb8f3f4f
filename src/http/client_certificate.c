/*
 * client_certificate.c - client certificates for mutual TLS (SPEC section
 * 12, "Client certificates"): the check eventgrid.set_client_certificate()
 * makes before it stores one.  The worker hands the PEM texts to libcurl as
 * they were stored (http.c: CURLOPT_SSLCERT_BLOB and CURLOPT_SSLKEY_BLOB);
 * this file only reads them with OpenSSL, which libcurl already links, and
 * never says anything of the key but whether it parses and matches.
 */
#include "core/eventgrid.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "access/htup_details.h"
#include "fmgr.h"
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

/* An ASN1_TIME as a timestamptz, through its difference from the Unix epoch; false if unreadable. */
static bool
asn1_time_to_timestamptz(const ASN1_TIME *t, TimestampTz *result)
{
	ASN1_TIME  *epoch = ASN1_TIME_set(NULL, 0);
	int			days = 0;
	int			secs = 0;
	bool		ok;

	ok = epoch != NULL && ASN1_TIME_diff(&days, &secs, epoch, t) == 1;
	ASN1_TIME_free(epoch);
	if (ok)
		*result = time_t_to_timestamptz((pg_time_t) days * SECS_PER_DAY + secs);
	return ok;
}

/*
 * OpenSSL's passphrase callback while the key is read: a key that asks for
 * one is encrypted (an empty passphrase included) and refused, so no key
 * stored can make libcurl ask for a password.
 */
static int
note_passphrase_asked(char *buf, int size, int rwflag, void *asked)
{
	*(bool *) asked = true;
	return -1;
}

/* The certificate's subject as RFC 2253 text (palloc'd). */
static char *
subject_text(X509 *cert)
{
	BIO		   *mem = BIO_new(BIO_s_mem());
	char	   *data;
	long		len;
	char	   *result;

	if (mem == NULL)
		ereport(ERROR, (errcode(ERRCODE_OUT_OF_MEMORY), errmsg("out of memory")));
	X509_NAME_print_ex(mem, X509_get_subject_name(cert), 0, XN_FLAG_RFC2253);
	len = BIO_get_mem_data(mem, &data);
	result = pnstrdup(data, len);
	BIO_free(mem);
	return result;
}

PG_FUNCTION_INFO_V1(eventgrid_client_certificate_info);

/*
 * SQL: eventgrid._client_certificate_info(certificate text, private_key
 * text, OUT subject text, OUT not_before timestamptz, OUT not_after
 * timestamptz).  certificate: PEM, the client certificate first, then any
 * chain; private_key: its PEM private key, not encrypted.  Errors (22023,
 * never quoting either text): a certificate or key that does not parse, an
 * encrypted key (even with an empty passphrase), a key that is not the
 * certificate's, a certificate not valid yet or
 * expired.  22004 for NULL.
 */
Datum
eventgrid_client_certificate_info(PG_FUNCTION_ARGS)
{
	text	   *cert_text;
	text	   *key_text;
	BIO		   *bio;
	X509	   *cert;
	EVP_PKEY   *key;
	TupleDesc	tupdesc;
	Datum		values[3];
	bool		nulls[3] = {false, false, false};
	TimestampTz not_before;
	TimestampTz not_after;
	const char *problem = NULL;
	char	   *subject;
	bool		passphrase_asked = false;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be NULL", PG_ARGISNULL(0) ? "certificate" : "private_key")));
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "eventgrid._client_certificate_info must return a record");
	cert_text = PG_GETARG_TEXT_PP(0);
	key_text = PG_GETARG_TEXT_PP(1);

	bio = BIO_new_mem_buf(VARDATA_ANY(cert_text), VARSIZE_ANY_EXHDR(cert_text));
	cert = bio ? PEM_read_bio_X509(bio, NULL, NULL, NULL) : NULL;
	BIO_free(bio);
	if (cert == NULL)
	{
		ERR_clear_error();
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("certificate is not a PEM certificate"),
				 errhint("Pass the client certificate as PEM text (\"-----BEGIN CERTIFICATE-----\"), followed by its chain if the receiver needs it.")));
	}

	/* an encrypted key fails instead of prompting, and says so */
	bio = BIO_new_mem_buf(VARDATA_ANY(key_text), VARSIZE_ANY_EXHDR(key_text));
	key = bio ? PEM_read_bio_PrivateKey(bio, NULL, note_passphrase_asked, &passphrase_asked) : NULL;
	BIO_free(bio);
	if (passphrase_asked)
		problem = "private_key is encrypted: it must have no passphrase, not even an empty one";
	else if (key == NULL)
		problem = "private_key is not an unencrypted PEM private key";
	else if (X509_check_private_key(cert, key) != 1)
		problem = "private_key does not belong to the certificate";
	ERR_clear_error();
	EVP_PKEY_free(key);
	if (problem != NULL)
	{
		X509_free(cert);
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s", problem),
				 errhint("Pass the certificate's own private key as PEM text (\"-----BEGIN PRIVATE KEY-----\"), without a passphrase (openssl pkey -in key.pem -out key-plain.pem removes one).")));
	}

	if (!asn1_time_to_timestamptz(X509_get0_notBefore(cert), &not_before) ||
		!asn1_time_to_timestamptz(X509_get0_notAfter(cert), &not_after))
	{
		X509_free(cert);
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("certificate has a validity date that cannot be read")));
	}
	subject = subject_text(cert);	/* (an out-of-memory ERROR leaks cert: once) */
	X509_free(cert);

	if (not_after <= GetCurrentTimestamp())
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("certificate expired at %s", timestamptz_to_str(not_after)),
				 errhint("Pass a certificate that is valid now.")));
	if (not_before > GetCurrentTimestamp())
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("certificate is not valid before %s", timestamptz_to_str(not_before)),
				 errhint("Pass a certificate that is valid now.")));

	values[0] = CStringGetTextDatum(subject);
	values[1] = TimestampTzGetDatum(not_before);
	values[2] = TimestampTzGetDatum(not_after);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(tupdesc), values, nulls)));
}
