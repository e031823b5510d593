"""A tenant's API credentials, in the tenant's own schema: tokens kept as digests, each with a scope and an end."""
