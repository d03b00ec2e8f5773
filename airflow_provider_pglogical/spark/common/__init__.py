"""What every job shares: the session, quoted identifiers, Java classes, Hadoop file access."""
