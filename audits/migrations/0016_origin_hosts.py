"""Hosts spelled as origins are (issue 31.3): a page or a shared link stored under a
trailing-dot host (`victim.com.`), or an IPv6 address unbracketed or uncompressed in a
page's domain, is respelled as `outbound.urls.normalize_url` spells it now, so one host
is one domain (the nightly re-audit's per-domain offset) and one link is one outcome.

A row whose new spelling is already taken keeps its old one: merging two pages would
merge their audits and callbacks, and the taken link's row is the one every audit reads
from now on (the old row ages out with LINKCHECK retention). The rule is inlined (not
imported) so this migration means the same thing whatever the code becomes.
"""

import ipaddress
from urllib.parse import urlsplit, urlunsplit

from django.db import migrations

BATCH = 500


def respelled_host(host: str) -> str:
    """`victim.com.` -> `victim.com`; `0:0::1` (a domain stored unbracketed) -> `[::1]`."""
    if ":" in host and not host.startswith("["):
        try:
            return f"[{ipaddress.IPv6Address(host).compressed}]"
        except ValueError:
            return host
    return host.removesuffix(".")


def respelled_url(url: str) -> str:
    """The URL with its host respelled; its other parts as stored."""
    parts = urlsplit(url)
    userinfo, at, hostport = parts.netloc.rpartition("@")
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        host = respelled_host(host)
    else:
        host, colon, port = hostport.partition(":")
        host, rest = respelled_host(host), colon + port
    return urlunsplit(parts._replace(netloc=f"{userinfo}{at}{host}{rest}"))


def respell_pages(apps, schema_editor):
    Page = apps.get_model("audits", "Page")
    stale = Page.objects.filter(domain__endswith=".") | Page.objects.filter(
        domain__contains=":"
    ).exclude(domain__startswith="[")
    for page in stale.order_by("id").iterator(chunk_size=BATCH):
        domain = respelled_host(page.domain)
        url = respelled_url(page.url)
        if url != page.url and Page.objects.filter(url=url).exists():
            url = page.url  # another page has it: two pages of one domain, not one page
        Page.objects.filter(id=page.id).update(domain=domain, url=url)


def respell_shared_links(apps, schema_editor):
    SharedLink = apps.get_model("audits", "SharedLink")
    # A dot just before the port or the path: `http://victim.com./`, `https://x.org.:81/`.
    stale = SharedLink.objects.filter(url__regex=r"^https?://([^/@]*@)?[^/@:]*\.(:[0-9]+)?/")
    for link in stale.order_by("id").iterator(chunk_size=BATCH):
        url = respelled_url(link.url)
        if url != link.url and not SharedLink.objects.filter(url=url).exists():
            SharedLink.objects.filter(id=link.id).update(url=url)


class Migration(migrations.Migration):
    dependencies = [
        ("audits", "0015_audit_client"),
    ]

    operations = [
        # The old spellings named the same servers: nothing to put back.
        migrations.RunPython(respell_pages, migrations.RunPython.noop),
        migrations.RunPython(respell_shared_links, migrations.RunPython.noop),
    ]
