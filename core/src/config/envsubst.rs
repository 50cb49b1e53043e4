//! `${env:VAR}` substitution.
