// Foundation/Foundation.h - NOT Apple's header: minimal stand-in declarations of the Foundation API that
// src/coreml_model.mm and src/coreml_backend.mm use, so that a Linux clang can syntax-check them
// (tests/objc/check_coreml_syntax.sh; Objective-C++, ARC, blocks). Each declaration was written from the signature
// in the macOS 15 / iOS 18 SDK's Foundation headers (NSString.h, NSValue.h, NSArray.h, NSDictionary.h, NSError.h,
// NSURL.h, NSFileManager.h, NSProcessInfo.h, NSEnumerator.h) as Apple documents them; only what the backend calls is
// here. A selector or type the backend misuses fails the check; one these stubs get wrong would not - the real SDK
// is the final word (README: "Core ML backend", what was and was not verified).
#pragma once

#include <stddef.h>
#include <stdint.h>

#define NS_ASSUME_NONNULL_BEGIN _Pragma("clang assume_nonnull begin")
#define NS_ASSUME_NONNULL_END _Pragma("clang assume_nonnull end")
#define NS_NOESCAPE __attribute__((noescape))
#define NS_RETURNS_INNER_POINTER __attribute__((objc_returns_inner_pointer))
// as the SDK spells them for C++11 / Objective-C++: a named enum with a fixed underlying type
#define NS_ENUM(_type, _name) enum _name : _type _name; enum _name : _type
#define NS_OPTIONS(_type, _name) enum _name : _type _name; enum _name : _type

// API_AVAILABLE(macos(15.0), ios(18.0)) -> clang availability attributes (up to four platforms)
#define ES_STUB_AV_macos(v) __attribute__((availability(macos, introduced = v)))
#define ES_STUB_AV_ios(v) __attribute__((availability(ios, introduced = v)))
#define ES_STUB_AV_tvos(v) __attribute__((availability(tvos, introduced = v)))
#define ES_STUB_AV_watchos(v) __attribute__((availability(watchos, introduced = v)))
#define ES_STUB_AV1(a) ES_STUB_AV_##a
#define ES_STUB_AV2(a, b) ES_STUB_AV1(a) ES_STUB_AV1(b)
#define ES_STUB_AV3(a, b, c) ES_STUB_AV2(a, b) ES_STUB_AV1(c)
#define ES_STUB_AV4(a, b, c, d) ES_STUB_AV3(a, b, c) ES_STUB_AV1(d)
#define ES_STUB_PICK(_1, _2, _3, _4, NAME, ...) NAME
#define API_AVAILABLE(...) ES_STUB_PICK(__VA_ARGS__, ES_STUB_AV4, ES_STUB_AV3, ES_STUB_AV2, ES_STUB_AV1)(__VA_ARGS__)

typedef long NSInteger;  // LP64, as on every 64-bit Apple platform
typedef unsigned long NSUInteger;
typedef bool BOOL;
#define YES true
#define NO false
#ifndef nil
#define nil nullptr
#endif

typedef struct objc_object* id;

NS_ASSUME_NONNULL_BEGIN

__attribute__((objc_root_class))
@interface NSObject
+ (instancetype)alloc;
+ (instancetype)new;
- (instancetype)init;
@end

typedef struct {
  unsigned long state;
  id __unsafe_unretained _Nullable* _Nullable itemsPtr;
  unsigned long* _Nullable mutationsPtr;
  unsigned long extra[5];
} NSFastEnumerationState;

@protocol NSFastEnumeration
- (NSUInteger)countByEnumeratingWithState:(NSFastEnumerationState*)state
                                  objects:(id __unsafe_unretained _Nullable[_Nonnull])buffer
                                    count:(NSUInteger)len;
@end

@interface NSString : NSObject
+ (nullable instancetype)stringWithUTF8String:(const char*)nullTerminatedCString;
@property (nullable, readonly) const char* UTF8String NS_RETURNS_INNER_POINTER;
- (NSString*)stringByAppendingPathComponent:(NSString*)str;
@end

@interface NSNumber : NSObject
@property (readonly) long long longLongValue;
+ (NSNumber*)numberWithInt:(int)value;
+ (NSNumber*)numberWithUnsignedInt:(unsigned int)value;
+ (NSNumber*)numberWithLong:(long)value;
+ (NSNumber*)numberWithUnsignedLong:(unsigned long)value;
+ (NSNumber*)numberWithLongLong:(long long)value;
+ (NSNumber*)numberWithUnsignedLongLong:(unsigned long long)value;
+ (NSNumber*)numberWithDouble:(double)value;
+ (NSNumber*)numberWithBool:(BOOL)value;
@end

@interface NSArray<__covariant ObjectType> : NSObject <NSFastEnumeration>
@property (readonly) NSUInteger count;
- (ObjectType)objectAtIndexedSubscript:(NSUInteger)idx;
+ (instancetype)arrayWithObjects:(const ObjectType _Nonnull[_Nonnull])objects count:(NSUInteger)cnt;
@end

@interface NSMutableArray<ObjectType> : NSArray<ObjectType>
+ (instancetype)arrayWithCapacity:(NSUInteger)numItems;
- (void)addObject:(ObjectType)anObject;
@end

@interface NSSet<__covariant ObjectType> : NSObject <NSFastEnumeration>
@property (readonly) NSUInteger count;
@end

@interface NSDictionary<__covariant KeyType, __covariant ObjectType> : NSObject <NSFastEnumeration>
@property (readonly) NSUInteger count;
- (nullable ObjectType)objectForKeyedSubscript:(KeyType)key;
+ (instancetype)dictionaryWithObjects:(const ObjectType _Nonnull[_Nullable])objects
                              forKeys:(const KeyType _Nonnull[_Nullable])keys
                                count:(NSUInteger)cnt;
@end

@interface NSMutableDictionary<KeyType, ObjectType> : NSDictionary<KeyType, ObjectType>
+ (instancetype)dictionaryWithCapacity:(NSUInteger)numItems;
- (void)setObject:(nullable ObjectType)obj forKeyedSubscript:(KeyType)key;
@end

typedef NSString* NSErrorDomain;

@interface NSError : NSObject
@property (readonly, copy) NSErrorDomain domain;
@property (readonly) NSInteger code;
@property (readonly, copy) NSString* localizedDescription;
@end

@interface NSURL : NSObject
+ (NSURL*)fileURLWithPath:(NSString*)path isDirectory:(BOOL)isDir;
- (nullable NSURL*)URLByAppendingPathComponent:(NSString*)pathComponent isDirectory:(BOOL)isDirectory;
@property (nullable, readonly, copy) NSString* path;
@end

typedef NSString* NSFileAttributeKey;

typedef NS_ENUM(NSUInteger, NSSearchPathDirectory) { NSCachesDirectory = 13 };
typedef NS_OPTIONS(NSUInteger, NSSearchPathDomainMask) { NSUserDomainMask = 1 };

@interface NSFileManager : NSObject
@property (class, readonly, strong) NSFileManager* defaultManager;
- (nullable NSURL*)URLForDirectory:(NSSearchPathDirectory)directory
                          inDomain:(NSSearchPathDomainMask)domain
                 appropriateForURL:(nullable NSURL*)url
                            create:(BOOL)shouldCreate
                             error:(NSError**)error;
- (BOOL)fileExistsAtPath:(NSString*)path;
- (BOOL)createDirectoryAtURL:(NSURL*)url
    withIntermediateDirectories:(BOOL)createIntermediates
                     attributes:(nullable NSDictionary<NSFileAttributeKey, id>*)attributes
                          error:(NSError**)error;
- (BOOL)moveItemAtURL:(NSURL*)srcURL toURL:(NSURL*)dstURL error:(NSError**)error;
- (BOOL)removeItemAtURL:(NSURL*)URL error:(NSError**)error;
@end

@interface NSProcessInfo : NSObject
@property (class, readonly, strong) NSProcessInfo* processInfo;
@property (readonly, copy) NSString* operatingSystemVersionString;
@end

NS_ASSUME_NONNULL_END
