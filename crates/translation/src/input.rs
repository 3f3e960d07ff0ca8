//! Reading objects.
